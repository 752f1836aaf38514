//! The operator's hand on a live sale (issue 47): the admin API under
//! `/admin/api/` and the console at `/admin/`, on a listener of their own
//! (`ADMIN_ADDR`, never the public port).
//!
//! Parts: `auth` (admin keys with scopes, the per-address rate), `control`
//! (the writes, each with its audit entry), `audit` (the append-only
//! `audit_log`), `live` (a sale second by second, shared by every viewer),
//! `routes` (the router), `console` (the web page), `error` (one error
//! type). Imports flow `routes → control, live, console → audit, auth,
//! error → sales, http, ops`.

pub mod audit;
pub mod auth;
pub mod console;
pub mod control;
pub mod error;
pub mod live;
pub mod openapi;
pub mod routes;
