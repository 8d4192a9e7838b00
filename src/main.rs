fn main() {
    std::process::exit(loopflow::main());
}
