fn main() {
    // `sqlx::migrate!` embeds the migrations: rebuild when one is added or changed.
    println!("cargo:rerun-if-changed=migrations");
}
