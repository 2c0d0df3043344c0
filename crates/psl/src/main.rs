//! `psl`: the one binary of PSL's product, a subcommand per user task and per role. Its code is
//! this package's library (`lib.rs` has the module map); here only the allocator. `psl bench`,
//! `psl report` and `psl chaos` run the `psl-tools` binary beside this one (`psl::tools`).

// jemalloc instead of glibc malloc: every node allocates a key and a value per op and a
// record buffer of tens of KiB per batch, and freeing those made glibc consolidate its arenas
// (~5% of CPU). `psl bench scl --cases w1` measured 2.2-2.4 µs of CPU per put with jemalloc
// against 2.8-3.3 µs with glibc (and 3.1-3.6 µs with mimalloc), same run, same machine.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    psl::cli::main()
}
