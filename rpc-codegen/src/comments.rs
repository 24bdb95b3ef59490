//! Proto comments → rustdoc that neither breaks `cargo doc` nor runs as a doctest.
//!
//! Comments travel to prost-build inside the `FileDescriptorSet` (its `SourceCodeInfo`); prost-build
//! turns them into `///` lines for messages, fields and enums, and we do the same for services and
//! RPCs through its `Comments`. prost-build escapes brackets and bare URLs per line, but leaves code
//! blocks alone: an indented block or a fence without a language would be compiled and run as a Rust
//! doctest. So before prost-build sees the set, every comment is rewritten here:
//! - every fenced block (```` ``` ```` or `~~~`, any info string) becomes a `text` block, and an
//!   unclosed fence is closed at the end of the comment;
//! - every indented code block becomes a fenced `text` block (measured with the indentation the
//!   line will have after prost-build adds its own leading space);
//! - outside code, a `<` that would open an HTML tag (`<T>`, `list<string>`) is escaped as `\<`;
//! - outside code, a link whose destination is not a URL — googleapis' `[Shelf][google.x.v1.Shelf]`,
//!   `[Shelf][]`, `[the service](Library)` — would be an intra-doc link to a Rust item that does not
//!   exist (or not by that name): it becomes plain text with the destination as code,
//!   ``Shelf (`google.x.v1.Shelf`)``, `` `Shelf` ``. Links to URLs (`https://..`, `#anchor`,
//!   `mailto:`, relative `.html` pages) stay links;
//! - a carriage return inside a line (a "bare CR", which no doc comment may contain) becomes a
//!   space;
//! - a code point that changes the direction of text (`U+202E`, ...), which rustc refuses in any
//!   comment, is written out as its `U+` name.

use prost_types::FileDescriptorSet;

/// Rewrites every comment in `fds` (leading, trailing and detached) with [`escape_doc`].
pub fn escape_fds_comments(fds: &mut FileDescriptorSet) {
    for file in &mut fds.file {
        let Some(info) = file.source_code_info.as_mut() else { continue };
        for location in &mut info.location {
            if let Some(text) = location.leading_comments.as_mut() {
                *text = escape_doc(text);
            }
            if let Some(text) = location.trailing_comments.as_mut() {
                *text = escape_doc(text);
            }
            for text in &mut location.leading_detached_comments {
                *text = escape_doc(text);
            }
        }
    }
}

/// A fence opened by the comment's author: its character (`` ` `` or `~`) and length.
struct Fence {
    marker: char,
    len: usize,
}

/// The indentation (in spaces; a tab counts 4) of `line`, as prost-build will emit it: it adds one
/// space to every non-empty line that does not start with exactly one space.
fn emitted_indent(line: &str) -> usize {
    let indent: usize =
        line.chars().take_while(|c| *c == ' ' || *c == '\t').map(|c| if c == '\t' { 4 } else { 1 }).sum();
    if indent == 1 {
        1
    } else {
        indent + 1
    }
}

/// A fence line: up to 3 spaces, then 3 or more of the same `` ` `` or `~`. Returns the marker, its
/// length and the rest of the line (the info string).
fn fence_of(line: &str) -> Option<(char, usize, &str)> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 + 1 {
        return None;
    }
    let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = trimmed.chars().take_while(|c| *c == marker).count();
    (len >= 3).then(|| (marker, len, &trimmed[len..]))
}

/// Rewrites one comment's text (lines as protoc gives them, each usually starting with a space) so
/// that rustdoc sees no Rust code block and no HTML tag. See the module docs.
pub fn escape_doc(text: &str) -> String {
    // A carriage return not ending a line is a "bare CR", which a doc comment must not contain
    // (the generated file would not parse): it becomes a space; CRLF endings become LF. A code
    // point that changes the direction of text is refused by rustc in any comment (the lint
    // `text_direction_codepoint_in_comment`, deny by default): it is written out as `U+202E`.
    let normalized;
    let text = if text.contains(|c| c == '\r' || is_bidi_control(c)) {
        let mut t = String::with_capacity(text.len() + 16);
        for c in text.replace("\r\n", "\n").chars() {
            match c {
                '\r' => t.push(' '),
                c if is_bidi_control(c) => t.push_str(&format!("U+{:04X}", c as u32)),
                c => t.push(c),
            }
        }
        normalized = t;
        normalized.as_str()
    } else {
        text
    };
    let lines: Vec<&str> = text.lines().collect();
    let base = lines.iter().filter(|l| !l.trim().is_empty()).map(|l| emitted_indent(l)).min().unwrap_or(1);

    let mut out = String::with_capacity(text.len() + 32);
    let mut fence: Option<Fence> = None;
    let mut in_indented = false;
    let mut pending_blank: Vec<&str> = Vec::new();
    let mut prev_blank = true;
    for line in &lines {
        let blank = line.trim().is_empty();
        if let Some(open) = &fence {
            out.push_str(line);
            out.push('\n');
            if let Some((marker, len, rest)) = fence_of(line) {
                if marker == open.marker && len >= open.len && rest.trim().is_empty() {
                    fence = None;
                }
            }
            prev_blank = blank;
            continue;
        }
        if in_indented {
            if blank {
                // Held back: blank lines at the end of the block go after the closing fence.
                pending_blank.push(line);
                continue;
            }
            if emitted_indent(line) >= base + 4 {
                for held in pending_blank.drain(..) {
                    out.push_str(held);
                    out.push('\n');
                }
                out.push_str(line);
                out.push('\n');
                continue;
            }
            out.push_str(" ```\n");
            for held in pending_blank.drain(..) {
                out.push_str(held);
                out.push('\n');
            }
            in_indented = false;
            prev_blank = true;
        }
        if let Some((marker, len, _info)) = fence_of(line) {
            let indent = &line[..line.len() - line.trim_start_matches(' ').len()];
            out.push_str(indent);
            out.extend(std::iter::repeat_n(marker, len));
            out.push_str("text\n");
            fence = Some(Fence { marker, len });
            prev_blank = false;
            continue;
        }
        if !blank && prev_blank && emitted_indent(line) >= base + 4 {
            out.push_str(" ```text\n");
            out.push_str(line);
            out.push('\n');
            in_indented = true;
            prev_blank = false;
            continue;
        }
        escape_html_tags(&unlink(line), &mut out);
        out.push('\n');
        prev_blank = blank;
    }
    if in_indented {
        out.push_str(" ```\n");
        for held in pending_blank {
            out.push_str(held);
            out.push('\n');
        }
    }
    if let Some(open) = fence {
        out.push(' ');
        out.extend(std::iter::repeat_n(open.marker, open.len));
        out.push('\n');
    }
    // protoc's comment text ends with a newline when the comment did; keep the text's own ending.
    if !text.ends_with('\n') && out.ends_with('\n') {
        out.pop();
    }
    out
}

/// Whether a link destination is a URL (a link rustdoc follows as is), not an item path.
fn is_url(dest: &str) -> bool {
    let dest = dest.trim();
    dest.contains("://")
        || dest.starts_with("mailto:")
        || dest.starts_with('#')
        || dest.starts_with('/')
        || dest.starts_with("./")
        || dest.starts_with("../")
        || dest.contains(".html")
}

/// `line` with every link whose destination is not a URL written as plain text (see the module
/// docs), outside inline code spans.
fn unlink(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    let mut i = 0;
    let bytes = line.as_bytes();
    while i < line.len() {
        let c = bytes[i];
        match c {
            b'`' => {
                let run = line[i..].bytes().take_while(|b| *b == b'`').count();
                out.push_str(&line[i..i + run]);
                in_code = !in_code;
                i += run;
            }
            b'\\' => {
                let next = line[i + 1..].chars().next().map_or(0, char::len_utf8);
                out.push_str(&line[i..i + 1 + next]);
                i += 1 + next;
            }
            b'[' if !in_code => match link_at(&line[i..]) {
                Some((len, text, dest)) => {
                    out.push_str(&plain_link(text, dest));
                    i += len;
                }
                None => {
                    out.push('[');
                    i += 1;
                }
            },
            _ => {
                let len = line[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&line[i..i + len]);
                i += len;
            }
        }
    }
    out
}

/// A link to rewrite at the start of `text` (`[..][..]` or `[..](..)` whose destination is not a
/// URL): its length, text and destination.
fn link_at(text: &str) -> Option<(usize, &str, &str)> {
    let close = text.find(']')?;
    let label = &text[1..close];
    if label.contains('[') {
        return None;
    }
    let rest = &text[close + 1..];
    let (open, end) = match rest.chars().next()? {
        '[' => ('[', ']'),
        '(' => ('(', ')'),
        _ => return None,
    };
    let dest_len = rest[1..].find(end)?;
    let dest = &rest[1..1 + dest_len];
    if dest.contains(open) || (open == '(' && is_url(dest)) || (open == '[' && is_url(dest)) {
        return None;
    }
    Some((close + 1 + 1 + dest_len + 1, label, dest))
}

/// The plain form of a link: its text, then the destination as code (just the text as code for
/// `[Name][]`).
fn plain_link(text: &str, dest: &str) -> String {
    let code = |s: &str| {
        if s.starts_with('`') && s.ends_with('`') && s.len() > 1 {
            s.to_owned()
        } else {
            format!("`{s}`")
        }
    };
    if dest.trim().is_empty() {
        code(text)
    } else {
        format!("{text} ({})", code(dest.trim()))
    }
}

/// The code points rustc's `text_direction_codepoint_in_comment` lint refuses (bidirectional
/// embeddings, overrides and isolates).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Copies `line` into `out`, escaping `<` where it would open an HTML tag (a letter, `/`, `!` or
/// `?` follows), outside inline code spans and except for autolinks (`<http://..>`, `<mailto:..>`).
fn escape_html_tags(line: &str, out: &mut String) {
    let mut in_code = false;
    let mut chars = line.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '`' => {
                // A run of backticks opens or closes a code span.
                while chars.peek().is_some_and(|(_, n)| *n == '`') {
                    out.push('`');
                    chars.next();
                }
                in_code = !in_code;
                out.push('`');
            }
            '\\' => {
                out.push('\\');
                if let Some((_, n)) = chars.next() {
                    out.push(n);
                }
            }
            '<' if !in_code => {
                let rest = &line[i + 1..];
                let opens_tag =
                    rest.starts_with(|n: char| n.is_ascii_alphabetic() || matches!(n, '/' | '!' | '?'));
                let autolink = rest.starts_with("http://")
                    || rest.starts_with("https://")
                    || rest.starts_with("mailto:");
                if opens_tag && !autolink {
                    out.push('\\');
                }
                out.push('<');
            }
            _ => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_unchanged() {
        let text = " Says hello.\n\n Second paragraph with `code` and a [link](https://example.com/x).\n";
        assert_eq!(escape_doc(text), text);
    }

    #[test]
    fn fences_become_text_blocks() {
        let text = " Example:\n ```\n let x = 1;\n ```\n after\n";
        assert_eq!(escape_doc(text), " Example:\n ```text\n let x = 1;\n ```\n after\n");
        let text = " ~~~~rust\n fn main() {}\n ~~~~\n";
        assert_eq!(escape_doc(text), " ~~~~text\n fn main() {}\n ~~~~\n");
    }

    #[test]
    fn an_unclosed_fence_is_closed() {
        assert_eq!(escape_doc(" ```\n code()\n"), " ```text\n code()\n ```\n");
    }

    #[test]
    fn indented_blocks_become_text_blocks() {
        let text = " Call it like this:\n\n     client.say_hello(req)?;\n     done();\n\n Then stop.\n";
        assert_eq!(
            escape_doc(text),
            " Call it like this:\n\n ```text\n     client.say_hello(req)?;\n     done();\n ```\n\n Then stop.\n"
        );
        // A block at the very start of the comment.
        assert_eq!(escape_doc(" a\n     x = 1\n"), " a\n     x = 1\n");
        assert_eq!(escape_doc("     x = 1\n a\n"), " ```text\n     x = 1\n ```\n a\n");
        // A comment indented as a whole is not code: rustdoc strips the common indentation.
        assert_eq!(escape_doc("     x = 1\n"), "     x = 1\n");
        // Blank lines inside a block stay inside; those after it go after the fence.
        assert_eq!(
            escape_doc(" a\n\n     x\n\n     y\n\n b\n"),
            " a\n\n ```text\n     x\n\n     y\n ```\n\n b\n"
        );
        // Three spaces of relative indentation become four once prost-build adds its space.
        assert_eq!(escape_doc(" a\n\n    b\n"), " a\n\n ```text\n    b\n ```\n");
    }

    #[test]
    fn indentation_inside_a_paragraph_is_not_code() {
        let text = " first line\n     continued\n";
        assert_eq!(escape_doc(text), text);
    }

    #[test]
    fn carriage_returns_never_reach_a_doc_comment() {
        assert_eq!(escape_doc(" a lone\rCR\r\n next\r\n"), " a lone CR\n next\n");
        assert_eq!(escape_doc(" ```\r\n x\r\n"), " ```text\n x\n ```\n");
        assert_eq!(escape_doc("\r"), " ");
    }

    #[test]
    fn text_direction_code_points_are_written_out() {
        assert_eq!(
            escape_doc(" admin\u{202E} \u{2066}x\u{2069} \u{200F}ok"),
            " adminU+202E U+2066xU+2069 \u{200F}ok"
        );
    }

    #[test]
    fn links_to_proto_names_become_plain_text() {
        assert_eq!(
            escape_doc(
                " the [Shelf][google.x.v1.Shelf], [Book][], [`Book`][google.x.v1.Book] and [it](Library)"
            ),
            " the Shelf (`google.x.v1.Shelf`), `Book`, `Book` (`google.x.v1.Book`) and it (`Library`)"
        );
        assert_eq!(
            escape_doc(" [docs](https://example.com/a), [up](#top), [page](other.html), [mail](mailto:a@b)"),
            " [docs](https://example.com/a), [up](#top), [page](other.html), [mail](mailto:a@b)"
        );
        assert_eq!(escape_doc(" `[a][b]` and \\[c][d] and [e]"), " `[a][b]` and \\[c][d] and [e]");
    }

    #[test]
    fn html_tags_are_escaped_outside_code() {
        assert_eq!(escape_doc(" a list<string> of <b>x</b>"), r" a list\<string> of \<b>x\</b>");
        assert_eq!(escape_doc(" `Vec<u8>` stays"), " `Vec<u8>` stays");
        assert_eq!(
            escape_doc(" see <https://example.com> and a < b"),
            " see <https://example.com> and a < b"
        );
        assert_eq!(escape_doc(r" already \<escaped>"), r" already \<escaped>");
    }
}
