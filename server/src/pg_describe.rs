//! What psql's describe commands need of the server beyond
//! datafusion-postgres's `pg_catalog`: `\du` lists the configured users
//! (`pg_roles`), `\df` calls `pg_function_is_visible`,
//! `pg_get_function_result` and `pg_get_function_arguments`, and `\du` and
//! `\d+` write `ARRAY(SELECT ...)`, which DataFusion does not plan.
//!
//! [`DescribeHook`] rewrites `ARRAY(SELECT e FROM ...)` to the scalar
//! subquery `(SELECT array_agg(e) FROM ...)` (NULL instead of `{}` when it
//! finds nothing), and to NULL when it reads a set-returning function of
//! the outer row (`unnest(tc.reloptions)`: table options leaseline has
//! none of). Statements without `ARRAY(...)` are left to the next hook.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, StringArray};
use datafusion::arrow::datatypes::{DataType, Int32Type};
use datafusion::common::ParamValues;
use datafusion::logical_expr::{
    create_udf, ColumnarValue, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use datafusion::prelude::SessionContext;
use datafusion::scalar::ScalarValue;
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, SelectItem, SetExpr, Statement,
    TableFactor, Value, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion_postgres::arrow_pg::datatypes::df;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::{
    PgCatalogContextProvider, Role,
};
use datafusion_postgres::hooks::{HookClient, QueryHook};
use datafusion_postgres::pgwire::api::portal::Format;
use datafusion_postgres::pgwire::api::results::Response;
use datafusion_postgres::pgwire::api::ClientInfo;
use datafusion_postgres::pgwire::error::{PgWireError, PgWireResult};
use datafusion_postgres::pgwire::types::format::FormatOptions;

/// The roles of `pg_roles`: the users who may log in. They may read
/// everything and change nothing.
#[derive(Debug, Clone)]
pub struct Roles(pub Arc<Vec<String>>);

#[async_trait]
impl PgCatalogContextProvider for Roles {
    async fn roles(&self) -> Vec<String> {
        self.0.as_ref().clone()
    }

    async fn role(&self, name: &str) -> Option<Role> {
        self.0.iter().any(|r| r == name).then(|| Role {
            name: name.to_owned(),
            is_superuser: false,
            can_login: true,
            can_create_db: false,
            can_create_role: false,
            can_create_user: false,
            can_replication: false,
            grants: vec![],
            inherited_roles: vec![],
        })
    }
}

/// Registers the functions `\df` calls, answered from `pg_proc` and
/// `pg_type` as they are now (both are fixed tables).
pub async fn install_functions(ctx: &SessionContext) -> datafusion::error::Result<()> {
    let mut type_names: HashMap<i64, String> = HashMap::new();
    let types = ctx
        .sql("SELECT CAST(oid AS BIGINT) AS oid, format_type(oid, NULL) AS name FROM pg_catalog.pg_type")
        .await?
        .collect()
        .await?;
    for batch in &types {
        let oids = batch
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let names = datafusion::arrow::compute::cast(batch.column(1), &DataType::Utf8)?;
        let names = names.as_string::<i32>();
        for i in 0..batch.num_rows() {
            if !oids.is_null(i) && !names.is_null(i) {
                type_names.insert(oids.value(i), names.value(i).to_owned());
            }
        }
    }
    let procs = ctx
        .sql("SELECT CAST(oid AS BIGINT), CAST(prorettype AS BIGINT), CAST(proargtypes AS VARCHAR) FROM pg_catalog.pg_proc")
        .await?
        .collect()
        .await?;
    let name_of = |oid: i64| {
        type_names
            .get(&oid)
            .cloned()
            .unwrap_or_else(|| oid.to_string())
    };
    let mut results: HashMap<i64, String> = HashMap::new();
    let mut arguments: HashMap<i64, String> = HashMap::new();
    for batch in &procs {
        let oids = batch
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let rets = batch
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let args = datafusion::arrow::compute::cast(batch.column(2), &DataType::Utf8)?;
        let args = args.as_string::<i32>();
        for i in 0..batch.num_rows() {
            if oids.is_null(i) {
                continue;
            }
            if !rets.is_null(i) {
                results.insert(oids.value(i), name_of(rets.value(i)));
            }
            let list = if args.is_null(i) { "" } else { args.value(i) };
            let formatted: Vec<String> = list
                .split_whitespace()
                .filter_map(|t| t.parse::<i64>().ok())
                .map(name_of)
                .collect();
            arguments.insert(oids.value(i), formatted.join(", "));
        }
    }
    for name in ["col_description", "obj_description", "shobj_description"] {
        ctx.register_udf(ScalarUDF::new_from_impl(NoComment {
            name,
            signature: Signature::variadic_any(Volatility::Immutable),
        }));
    }
    ctx.register_udf(oid_text_udf("pg_get_function_result", results));
    ctx.register_udf(oid_text_udf("pg_get_function_arguments", arguments));
    ctx.register_udf(create_udf(
        "pg_function_is_visible",
        vec![DataType::Int32],
        DataType::Boolean,
        Volatility::Stable,
        // One schema is searched: every function is visible.
        Arc::new(|args: &[ColumnarValue]| match &args[0] {
            ColumnarValue::Scalar(s) => Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(
                !s.is_null(),
            )))),
            ColumnarValue::Array(a) => Ok(ColumnarValue::Array(Arc::new(
                (0..a.len())
                    .map(|i| Some(a.is_valid(i)))
                    .collect::<datafusion::arrow::array::BooleanArray>(),
            ))),
        }),
    ));
    Ok(())
}

/// A function of any arguments that is always NULL of type text: the
/// comments psql shows (`col_description`, `obj_description`), which
/// leaseline's tables do not have.
#[derive(Debug, PartialEq, Eq, Hash)]
struct NoComment {
    name: &'static str,
    signature: Signature,
}

impl ScalarUDFImpl for NoComment {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(
        &self,
        _args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)))
    }
}

/// A function of a `pg_proc` oid answered from a fixed table.
fn oid_text_udf(name: &str, table: HashMap<i64, String>) -> ScalarUDF {
    let table = Arc::new(table);
    create_udf(
        name,
        vec![DataType::Int32],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(move |args: &[ColumnarValue]| {
            let look = |oid: Option<i32>| oid.and_then(|o| table.get(&(o as i64)).cloned());
            match &args[0] {
                ColumnarValue::Scalar(ScalarValue::Int32(o)) => {
                    Ok(ColumnarValue::Scalar(ScalarValue::Utf8(look(*o))))
                }
                ColumnarValue::Scalar(_) => Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))),
                ColumnarValue::Array(a) => {
                    let oids = a.as_primitive::<Int32Type>();
                    let out: StringArray = oids.iter().map(look).collect();
                    Ok(ColumnarValue::Array(Arc::new(out)))
                }
            }
        }),
    )
}

/// See the module's documentation.
pub struct DescribeHook;

/// The statement with every `ARRAY(subquery)` rewritten, or None when it
/// has none.
fn rewrite(statement: &Statement) -> Option<Statement> {
    let mut rewritten = statement.clone();
    let mut visitor = ArraySubqueries { changed: false };
    let _ = rewritten.visit(&mut visitor);
    visitor.changed.then_some(rewritten)
}

struct ArraySubqueries {
    changed: bool,
}

impl VisitorMut for ArraySubqueries {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        // `pg_class.reloptions` (storage parameters, `\d+`): leaseline's
        // tables have none, and datafusion-postgres's pg_class lacks it.
        let column = match &*expr {
            Expr::Identifier(i) => Some(&i.value),
            Expr::CompoundIdentifier(parts) => parts.last().map(|i| &i.value),
            _ => None,
        };
        if column.is_some_and(|c| c.eq_ignore_ascii_case("reloptions")) {
            self.changed = true;
            *expr = parse_expr("CAST(NULL AS TEXT[])");
            return ControlFlow::Continue(());
        }
        let Expr::Function(function) = expr else {
            return ControlFlow::Continue(());
        };
        if !function.name.to_string().eq_ignore_ascii_case("array") {
            return ControlFlow::Continue(());
        }
        let FunctionArguments::Subquery(query) = &function.args else {
            return ControlFlow::Continue(());
        };
        let mut query = query.clone();
        let SetExpr::Select(select) = query.body.as_mut() else {
            return ControlFlow::Continue(());
        };
        self.changed = true;
        let reads_a_function = select.from.iter().any(|t| {
            matches!(
                t.relation,
                TableFactor::Function { .. } | TableFactor::UNNEST { .. }
            ) || matches!(&t.relation, TableFactor::Table { args: Some(_), .. })
        });
        let element = match select.projection.as_slice() {
            [SelectItem::UnnamedExpr(e)] | [SelectItem::ExprWithAlias { expr: e, .. }] => e.clone(),
            _ => {
                *expr = Expr::Value(Value::Null.into());
                return ControlFlow::Continue(());
            }
        };
        if reads_a_function {
            *expr = Expr::Value(Value::Null.into());
            return ControlFlow::Continue(());
        }
        let mut aggregate = parse_expr("array_agg(NULL)");
        if let Expr::Function(f) = &mut aggregate {
            if let FunctionArguments::List(list) = &mut f.args {
                list.args = vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(element))];
            }
        }
        select.projection = vec![SelectItem::UnnamedExpr(aggregate)];
        *expr = Expr::Subquery(query);
        ControlFlow::Continue(())
    }
}

fn parse_expr(sql: &str) -> Expr {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .expect("a fixed expression parses")
}

fn api_error(e: datafusion::error::DataFusionError) -> PgWireError {
    PgWireError::ApiError(Box::new(e))
}

#[async_trait]
impl QueryHook for DescribeHook {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        let rewritten = rewrite(statement)?;
        let result = async {
            let df = ctx
                .sql_with_options(&rewritten.to_string(), leaseline_query::read_only_options())
                .await
                .map_err(api_error)?;
            let format = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
            let rows = df::encode_dataframe(df, &Format::UnifiedText, Some(format)).await?;
            Ok(Response::Query(rows))
        };
        Some(result.await)
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        let rewritten = rewrite(statement)?;
        let state = ctx.state();
        let plan = async {
            let statement = state.sql_to_statement(
                &rewritten.to_string(),
                &datafusion::config::Dialect::PostgreSQL,
            )?;
            state.statement_to_plan(statement).await
        };
        Some(plan.await.map_err(api_error))
    }

    async fn handle_extended_query(
        &self,
        _statement: &Statement,
        _plan: &LogicalPlan,
        _params: &ParamValues,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> Option<String> {
        let statement = Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .unwrap()
            .remove(0);
        rewrite(&statement).map(|s| s.to_string())
    }

    #[test]
    fn array_subqueries_become_aggregates_or_null() {
        assert_eq!(rewritten("SELECT 1"), None);
        assert_eq!(
            rewritten("SELECT ARRAY(SELECT b.rolname FROM pg_roles b WHERE b.oid = r.oid) AS m FROM pg_roles r").as_deref(),
            Some("SELECT (SELECT array_agg(b.rolname) FROM pg_roles b WHERE b.oid = r.oid) AS m FROM pg_roles r")
        );
        assert_eq!(
            rewritten("SELECT c.reloptions || array(select 'toast.' || x from pg_catalog.unnest(tc.reloptions) x) FROM pg_class c").as_deref(),
            Some("SELECT CAST(NULL AS TEXT[]) || NULL FROM pg_class c")
        );
    }
}
