//! The key rings, the admin keys and bearer tokens of requests (Wasm only).
//!
//! Invariant kept here: a ring (and `ADMIN_KEYS`) is parsed once per
//! isolate and per secret text, so a rotated secret is read on the next
//! request and an unchanged one costs a string comparison.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use token::{Claims, Expect, KeyRing, TokenType};
use worker::{Env, Request};

use crate::api::error::{ApiError, ApiResult};
use crate::api::routes;
use crate::guard::admin::AdminKeys;
use crate::http::respond::now_ms;

thread_local! {
    static RINGS: RefCell<HashMap<&'static str, (String, Rc<KeyRing>)>> = RefCell::new(HashMap::new());
    static ADMIN: RefCell<Option<(String, Rc<AdminKeys>)>> = const { RefCell::new(None) };
}

/// The admin keys (`ADMIN_KEYS`, a secret; unset: none, so nobody is let
/// in), parsed once per isolate. A malformed list is a 500 `config_error`
/// on the routes that need it, naming no secret.
pub(crate) fn admin_keys(env: &Env) -> ApiResult<Rc<AdminKeys>> {
    let raw = env
        .secret("ADMIN_KEYS")
        .map(|s| s.to_string())
        .or_else(|_| env.var("ADMIN_KEYS").map(|v| v.to_string()))
        .unwrap_or_default();
    if let Some(k) = ADMIN.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|(text, _)| *text == raw)
            .map(|(_, k)| k.clone())
    }) {
        return Ok(k);
    }
    let parsed =
        Rc::new(AdminKeys::parse(Some(&raw)).map_err(|m| ApiError::new(500, "config_error", m))?);
    ADMIN.with(|c| *c.borrow_mut() = Some((raw, parsed.clone())));
    Ok(parsed)
}

/// The key ring named `name` from the environment, parsed once per isolate.
pub(crate) fn ring(env: &Env, name: &'static str) -> ApiResult<Rc<KeyRing>> {
    let raw = env
        .secret(name)
        .map(|s| s.to_string())
        .or_else(|_| env.var(name).map(|v| v.to_string()))
        .map_err(|_| ApiError::new(500, "config_error", format!("{name} is not set")))?;
    if let Some(r) = RINGS.with(|m| {
        m.borrow()
            .get(name)
            .filter(|(text, _)| *text == raw)
            .map(|(_, r)| r.clone())
    }) {
        return Ok(r);
    }
    let parsed = Rc::new(
        KeyRing::parse(&raw)
            .map_err(|e| ApiError::new(500, "config_error", format!("{name}: {e}")))?,
    );
    RINGS.with(|m| m.borrow_mut().insert(name, (raw, parsed.clone())));
    Ok(parsed)
}

/// The request's bearer token, or a 401 `token_missing`.
pub(crate) fn bearer_of(req: &Request) -> ApiResult<String> {
    let h = req.headers().get("authorization").ok().flatten();
    routes::bearer(h.as_deref())
        .map(str::to_string)
        .ok_or_else(ApiError::token_missing)
}

/// The claims of a valid ticket of `sale` (every token error its code).
pub(crate) fn ticket_claims(tickets: &KeyRing, sale: &str, ticket: &str) -> ApiResult<Claims> {
    tickets
        .verify(
            ticket,
            Expect {
                typ: TokenType::Ticket,
                sale: Some(sale),
            },
            now_ms() / 1000,
        )
        .map_err(ApiError::token)
}
