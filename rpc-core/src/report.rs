//! The `Debug` form of the public error types as `anyhow` prints a report: what `Display` says,
//! then the chain of sources it does not already say. `fn main() -> Result<(), E>` prints an
//! error's `Debug` (`Error: ...`); with this it reads like the `Display` text, not a struct dump.

use std::error::Error;
use std::fmt;

/// Writes `e`'s report into `f`: its `Display` text, then, under `Caused by:`, each source in
/// the chain whose text the lines before do not already contain (errors here often put their
/// source's text into their own, as `listen on ADDR: Address already in use` does).
pub(crate) fn write_report(e: &dyn Error, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut said = e.to_string();
    f.write_str(&said)?;
    let mut causes = Vec::new();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !said.contains(&text) {
            said.push('\n');
            said.push_str(&text);
            causes.push(text);
        }
        next = cause.source();
    }
    match causes.as_slice() {
        [] => Ok(()),
        [one] => write!(f, "\n\nCaused by:\n    {one}"),
        many => {
            f.write_str("\n\nCaused by:")?;
            many.iter().enumerate().try_for_each(|(i, c)| write!(f, "\n    {i}: {c}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with `text` and an optional source.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);
    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }
    /// Prints through `write_report`.
    struct Report<'e>(&'e dyn Error);
    impl fmt::Debug for Report<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_report(self.0, f)
        }
    }

    #[test]
    fn a_report_is_the_display_text_then_the_sources_not_yet_said() {
        let alone = Layer("top", None);
        assert_eq!(format!("{:?}", Report(&alone)), "top");
        // A source the text already holds is not said twice.
        let said = Layer("listen on a: in use", Some(Box::new(Layer("in use", None))));
        assert_eq!(format!("{:?}", Report(&said)), "listen on a: in use");
        let one = Layer("top", Some(Box::new(Layer("middle", None))));
        assert_eq!(format!("{:?}", Report(&one)), "top\n\nCaused by:\n    middle");
        let two = Layer("top", Some(Box::new(Layer("middle", Some(Box::new(Layer("root", None)))))));
        assert_eq!(format!("{:?}", Report(&two)), "top\n\nCaused by:\n    0: middle\n    1: root");
    }
}
