//! Cache keys as hashes of their inputs: what a fixture keeps in the cache from run to run (a
//! template data directory, a broker instance) is named or marked by a short hash of everything
//! it is made from, so that changing any of it makes the thing again, and no version is bumped
//! by hand (scripts/services/common.sh's `stamp` does the same for the shell's servers).

use std::process::Command;

/// The first 16 hex digits of the SHA-256 of `inputs`, each followed by a newline (sha256sum's,
/// as the shell's stamps take it).
pub fn of(inputs: &[&str]) -> String {
    let text: String = inputs.iter().map(|input| format!("{input}\n")).collect();
    let output = crate::process::output_with_stdin(&mut Command::new("sha256sum"), &text)
        .unwrap_or_else(|e| panic!("run sha256sum: {e}"));
    assert!(
        output.status.success(),
        "sha256sum failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .chars()
        .take(16)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_key_is_sha256sums_of_the_inputs_one_a_line() {
        // printf 'a\nb\n' | sha256sum
        assert_eq!(super::of(&["a", "b"]), "911169ddaaf146af");
        assert_ne!(super::of(&["a", "b"]), super::of(&["a", "c"]));
    }
}
