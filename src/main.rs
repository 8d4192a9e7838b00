fn main() {
    std::process::exit(loopflow::cli::main());
}
