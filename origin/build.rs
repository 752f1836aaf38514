//! Rebuilds the origin when `migrations/` changes: `sqlx::migrate!` embeds
//! the files at compile time, and cargo would not otherwise notice a new one
//! (a stale binary would run without it).

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
