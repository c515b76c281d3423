//! The `nova` command line.

/// Runs the command; the exit status.
pub fn main(args: Vec<String>) -> i32 {
    match args.first().map(String::as_str) {
        Some("serve") => match crate::serve::run(&args[1..]) {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("nova serve: {error}");
                1
            }
        },
        _ => {
            eprintln!("usage: nova serve [--listen ADDR] [--data-dir DIR]");
            2
        }
    }
}
