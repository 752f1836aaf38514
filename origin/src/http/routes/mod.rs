//! The handlers, one file per resource: each reads its request (bodies from
//! `crate::http::bodies`, credentials from `crate::http::auth`), calls the
//! domain modules, and answers with the types of `crate::http::api` or an
//! [`ApiError`](crate::http::error::ApiError). They are wired to paths in
//! `crate::http::router`.

pub(crate) mod health;
pub(crate) mod payments;
pub(crate) mod reservations;
pub(crate) mod sales;
