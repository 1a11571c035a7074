//! Where the lake lives: a local directory or any `object_store` URL.

use std::path::PathBuf;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use url::Url;

use crate::error::{LakeError, Result};

/// An object store rooted at the lake's directory.
#[derive(Clone)]
pub struct LakeStore {
    store: Arc<dyn ObjectStore>,
    /// The lake's root inside `store`.
    root: Path,
    /// The root as a directory when the lake is local, to fsync what we write.
    local_root: Option<PathBuf>,
    url: Url,
}

impl std::fmt::Debug for LakeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeStore")
            .field("url", &self.url.as_str())
            .finish()
    }
}

/// Object store options from the environment (`AWS_*`, `GOOGLE_*`,
/// `AZURE_*`), as the stores' own builders name them.
fn env_options() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("AWS_") || k.starts_with("GOOGLE_") || k.starts_with("AZURE_")
        })
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

impl LakeStore {
    /// Opens `location` for writing: a path (created if missing) or a URL
    /// such as `file:///var/lib/leaseline`, `s3://bucket/prefix`,
    /// `gs://...`, `az://...`, `memory:///`.
    pub fn open(location: &str) -> Result<Self> {
        Self::open_with(location, true)
    }

    /// Opens `location` for reading: a local directory must already exist,
    /// so that a mistyped path is reported instead of created.
    pub fn open_existing(location: &str) -> Result<Self> {
        Self::open_with(location, false)
    }

    fn open_with(location: &str, create: bool) -> Result<Self> {
        let bad = |reason: String| LakeError::Location {
            location: location.to_string(),
            reason,
        };
        let looks_like_url = location.contains("://");
        if !looks_like_url || location.starts_with("file://") {
            let dir = if looks_like_url {
                Url::parse(location)
                    .map_err(|e| bad(e.to_string()))?
                    .to_file_path()
                    .map_err(|_| bad("not a local file URL".into()))?
            } else {
                PathBuf::from(location)
            };
            if create {
                std::fs::create_dir_all(&dir)?;
            } else if !dir.is_dir() {
                return Err(LakeError::NotFound {
                    location: location.to_string(),
                    reason: "no such directory".into(),
                });
            }
            let dir = dir.canonicalize()?;
            let url = Url::from_directory_path(&dir).map_err(|_| bad("not absolute".into()))?;
            let store = LocalFileSystem::new_with_prefix(&dir)?;
            return Ok(LakeStore {
                store: Arc::new(store),
                root: Path::default(),
                local_root: Some(dir),
                url,
            });
        }
        let mut url = Url::parse(location).map_err(|e| bad(e.to_string()))?;
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        let (store, root) = object_store::parse_url_opts(&url, env_options())?;
        Ok(LakeStore {
            store: Arc::from(store),
            root,
            local_root: None,
            url,
        })
    }

    /// Where the Delta table in directory `name` lives, as `deltalake`
    /// wants it: a store whose root is the store's own root (the file
    /// system's, for a local lake) and the table's URL.
    pub fn delta_location(&self, name: &str) -> Result<(Arc<dyn ObjectStore>, Url)> {
        let location = self
            .url
            .join(&format!("{name}/"))
            .map_err(|e| LakeError::Location {
                location: self.url.to_string(),
                reason: e.to_string(),
            })?;
        let root: Arc<dyn ObjectStore> = match &self.local_root {
            Some(_) => Arc::new(LocalFileSystem::new()),
            None => self.store.clone(),
        };
        Ok((root, location))
    }

    /// The lake root as a URL ending in `/`.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The lake's directory, when it is local.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local_root.as_deref()
    }

    /// True when the lake is a local directory.
    pub fn is_local(&self) -> bool {
        self.local_root.is_some()
    }

    /// The object store holding the lake; paths inside it are
    /// [`LakeStore::path`] of lake-relative paths.
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// The object store path of a lake-relative path.
    pub fn path(&self, rel: &str) -> Path {
        if self.root.as_ref().is_empty() {
            Path::from(rel)
        } else {
            Path::from(format!("{}/{rel}", self.root.as_ref()))
        }
    }

    fn rel(&self, p: &Path) -> String {
        let s = p.as_ref();
        let root = self.root.as_ref();
        if root.is_empty() {
            s.to_string()
        } else {
            s.strip_prefix(root)
                .map(|r| r.trim_start_matches('/').to_string())
                .unwrap_or_else(|| s.to_string())
        }
    }

    /// Writes a whole object, durably when the lake is local.
    pub async fn put(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        self.store
            .put(&self.path(rel), PutPayload::from(bytes))
            .await?;
        self.sync(rel)?;
        Ok(())
    }

    /// Writes an object only if none exists at `rel`; `Ok(false)` if one did.
    pub async fn put_new(&self, rel: &str, bytes: Vec<u8>) -> Result<bool> {
        let opts = PutOptions::from(PutMode::Create);
        match self
            .store
            .put_opts(&self.path(rel), PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => {
                self.sync(rel)?;
                Ok(true)
            }
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// LocalFileSystem renames a staged file into place but does not fsync;
    /// an offset may only count as consumed once its file survives a power
    /// cut, so flush the file and its directory here.
    pub(crate) fn sync(&self, rel: &str) -> Result<()> {
        if let Some(root) = &self.local_root {
            let path = root.join(rel);
            std::fs::File::open(&path)?.sync_all()?;
            if let Some(dir) = path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
        }
        Ok(())
    }

    /// Whether an object exists at `rel` (one HEAD request on object
    /// storage; no listing).
    pub async fn exists(&self, rel: &str) -> Result<bool> {
        match self.store.head(&self.path(rel)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn get(&self, rel: &str) -> Result<bytes::Bytes> {
        Ok(self.store.get(&self.path(rel)).await?.bytes().await?)
    }

    pub async fn delete(&self, rel: &str) -> Result<()> {
        match self.store.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Lists objects under a lake-relative prefix: (relative path, size,
    /// last modified).
    pub async fn list(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, u64, chrono::DateTime<chrono::Utc>)>> {
        let p = self.path(prefix);
        let metas: Vec<_> = self.store.list(Some(&p)).try_collect().await?;
        Ok(metas
            .into_iter()
            .map(|m| (self.rel(&m.location), m.size, m.last_modified))
            .collect())
    }
}
