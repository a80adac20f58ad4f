//! Tables in the seed's box-drawing style (a heavy header, light body).
//!
//! Content is never cut. Without a width limit (stdout is not a terminal) every column is
//! as wide as its widest cell. With a limit (the terminal's width) the widest columns give
//! way first and their cells wrap: at spaces where a word fits, inside a word only where
//! it does not. Cells may hold `\n` for explicit line breaks.

/// Display width of one char in a terminal: 0 for combining marks and zero-width
/// characters, 2 for East Asian wide and fullwidth ones and emoji, else 1.
pub fn char_width(c: char) -> usize {
    let u = c as u32;
    if u == 0 {
        return 0;
    }
    if u < 0x20 || (0x7f..0xa0).contains(&u) {
        return 0;
    }
    if (0x0300..=0x036f).contains(&u)
        || (0x200b..=0x200f).contains(&u)
        || (0xfe00..=0xfe0f).contains(&u)
        || (0x1ab0..=0x1aff).contains(&u)
        || (0x20d0..=0x20ff).contains(&u)
    {
        return 0;
    }
    let wide = (0x1100..=0x115f).contains(&u)
        || (0x2e80..=0x303e).contains(&u)
        || (0x3041..=0x33ff).contains(&u)
        || (0x3400..=0x4dbf).contains(&u)
        || (0x4e00..=0x9fff).contains(&u)
        || (0xa000..=0xa4cf).contains(&u)
        || (0xac00..=0xd7a3).contains(&u)
        || (0xf900..=0xfaff).contains(&u)
        || (0xfe30..=0xfe4f).contains(&u)
        || (0xff00..=0xff60).contains(&u)
        || (0xffe0..=0xffe6).contains(&u)
        || (0x1f300..=0x1f64f).contains(&u)
        || (0x1f900..=0x1f9ff).contains(&u)
        || (0x20000..=0x3fffd).contains(&u);
    if wide {
        2
    } else {
        1
    }
}

/// Display width of a string (one line).
pub fn str_width(s: &str) -> usize {
    s.chars().map(char_width).sum()
}

/// A table: headers and rows of cells.
#[derive(Debug, Default, Clone)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Table {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row (missing cells are empty, extra ones ignored).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut r: Vec<String> = cells.into_iter().map(Into::into).collect();
        r.resize(self.headers.len(), String::new());
        self.rows.push(r);
    }

    fn cells(&self) -> impl Iterator<Item = (usize, &String)> {
        self.rows
            .iter()
            .chain(std::iter::once(&self.headers))
            .flat_map(|r| r.iter().enumerate())
    }

    /// Column widths: natural, then shrunk to fit `limit` (total width) if given.
    fn widths(&self, limit: Option<usize>) -> Vec<usize> {
        let n = self.headers.len();
        let mut natural = vec![1usize; n];
        // The narrowest a column gets without breaking a word, and at all.
        let mut word_floor = vec![1usize; n];
        for (i, c) in self.cells() {
            for line in c.split('\n') {
                natural[i] = natural[i].max(str_width(line));
                word_floor[i] = word_floor[i].max(piece_floor(line));
            }
        }
        let Some(limit) = limit else {
            return natural;
        };
        let overhead = 3 * n + 1;
        let avail = limit.saturating_sub(overhead);
        let mut w = natural.clone();
        let hard_floor: Vec<usize> = natural.iter().map(|&x| x.min(4)).collect();
        for floor in [&word_floor, &hard_floor] {
            while w.iter().sum::<usize>() > avail {
                let cands = (0..n).filter(|&i| w[i] > floor[i].min(natural[i]));
                // Shrink the column that costs the fewest extra lines (then the widest);
                // for long tables just the widest, to stay fast.
                let pick = if self.rows.len() <= 200 {
                    cands.min_by_key(|&i| {
                        let mut t = w.clone();
                        t[i] -= 1;
                        (self.height(&t), usize::MAX - w[i], i)
                    })
                } else {
                    cands.max_by_key(|&i| (w[i], usize::MAX - i))
                };
                let Some(i) = pick else { break };
                w[i] -= 1;
            }
        }
        if self.rows.len() <= 200 {
            self.rebalance(&mut w, &natural, &word_floor);
        }
        w
    }

    /// Greedy shrinking is short-sighted: move width between columns while that makes the
    /// table shorter (`Local sandboxes` may take two lines so `Features` takes fewer).
    fn rebalance(&self, w: &mut Vec<usize>, natural: &[usize], word_floor: &[usize]) {
        let n = w.len();
        let mut best_h = self.height(w);
        loop {
            let mut best: Option<Vec<usize>> = None;
            for i in 0..n {
                for j in (0..n).filter(|&j| j != i) {
                    let floor = word_floor[j].min(natural[j]).min(w[j]);
                    let max_k = (w[j] - floor).min(natural[i].saturating_sub(w[i]));
                    for k in 1..=max_k.min(24) {
                        let mut t = w.clone();
                        t[i] += k;
                        t[j] -= k;
                        let h = self.height(&t);
                        if h < best_h {
                            best_h = h;
                            best = Some(t);
                        }
                    }
                }
            }
            match best {
                Some(t) => *w = t,
                None => break,
            }
        }
    }

    /// Lines the table's cells take at these widths.
    fn height(&self, w: &[usize]) -> usize {
        self.rows
            .iter()
            .chain(std::iter::once(&self.headers))
            .map(|r| {
                r.iter()
                    .zip(w)
                    .map(|(c, &cw)| wrap(c, cw).len())
                    .max()
                    .unwrap_or(1)
            })
            .sum()
    }

    /// Render with at most `limit` columns when given (content wraps, never is cut).
    pub fn render(&self, limit: Option<usize>) -> String {
        let w = self.widths(limit);
        let mut out = String::new();
        let rule = |l: &str, m: &str, r: &str, h: &str, out: &mut String| {
            out.push_str(l);
            for (i, cw) in w.iter().enumerate() {
                if i > 0 {
                    out.push_str(m);
                }
                out.push_str(&h.repeat(cw + 2));
            }
            out.push_str(r);
            out.push('\n');
        };
        rule("┏", "┳", "┓", "━", &mut out);
        render_row(&self.headers, &w, "┃", &mut out);
        rule("┡", "╇", "┩", "━", &mut out);
        for r in &self.rows {
            render_row(r, &w, "│", &mut out);
        }
        rule("└", "┴", "┘", "─", &mut out);
        out
    }
}

fn render_row(cells: &[String], w: &[usize], sep: &str, out: &mut String) {
    let wrapped: Vec<Vec<String>> = cells.iter().zip(w).map(|(c, &cw)| wrap(c, cw)).collect();
    let height = wrapped.iter().map(Vec::len).max().unwrap_or(1).max(1);
    for line in 0..height {
        out.push_str(sep);
        for (i, cw) in w.iter().enumerate() {
            let text = wrapped[i].get(line).map_or("", String::as_str);
            out.push(' ');
            out.push_str(text);
            out.push_str(&" ".repeat(cw.saturating_sub(str_width(text))));
            out.push(' ');
            out.push_str(sep);
        }
        out.push('\n');
    }
}

/// Where a line may break: after a space, a comma, a slash or an opening parenthesis
/// (`sandbox(` / `lifecycle,` / `timeout,pause)`). Each piece keeps its break char.
fn pieces(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in line.char_indices() {
        if matches!(c, ' ' | ',' | '/' | '(') {
            let end = i + c.len_utf8();
            out.push(&line[start..end]);
            start = end;
        }
    }
    if start < line.len() || out.is_empty() {
        out.push(&line[start..]);
    }
    out
}

/// The narrowest a column can be without breaking inside a piece (see [`pieces`]).
fn piece_floor(line: &str) -> usize {
    pieces(line)
        .iter()
        .map(|p| str_width(p.trim_end_matches(' ')))
        .max()
        .unwrap_or(0)
}

/// Wrap `text` to `width` display columns: at spaces, commas, slashes and opening
/// parentheses where a piece fits, inside a piece only where it does not. Every
/// character is kept (spaces at a break aside).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    for para in text.split('\n') {
        let mut cur = String::new();
        for piece in pieces(para) {
            let trimmed = piece.trim_end_matches(' ');
            if str_width(&cur) + str_width(trimmed) <= width {
                cur.push_str(piece);
                continue;
            }
            if !cur.trim_end().is_empty() {
                lines.push(cur.trim_end().to_owned());
                cur.clear();
            }
            if str_width(trimmed) <= width {
                cur.push_str(piece);
                continue;
            }
            // A piece wider than the column: split it.
            let mut cur_w = str_width(&cur);
            for ch in trimmed.chars() {
                let cw = char_width(ch);
                if cur_w + cw > width && cur_w > 0 {
                    lines.push(std::mem::take(&mut cur));
                    cur_w = 0;
                }
                cur.push(ch);
                cur_w += cw;
            }
            cur.push_str(&piece[trimmed.len()..]);
        }
        lines.push(cur.trim_end().to_owned());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(["ID", "Template", "Status", "Region"]);
        t.row([
            "opensandbox:50953498-6542-4e36-9928-3bd3a2f5e7e6",
            "python:3.12-slim",
            "running",
            "",
        ]);
        t
    }

    #[test]
    fn unlimited_tables_keep_everything_on_one_line() {
        let s = sample().render(None);
        assert_eq!(
            s,
            "┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┓\n\
             ┃ ID                                               ┃ Template         ┃ Status  ┃ Region ┃\n\
             ┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━┩\n\
             │ opensandbox:50953498-6542-4e36-9928-3bd3a2f5e7e6 │ python:3.12-slim │ running │        │\n\
             └──────────────────────────────────────────────────┴──────────────────┴─────────┴────────┘\n"
        );
    }

    #[test]
    fn limited_tables_wrap_instead_of_cutting() {
        let s = sample().render(Some(80));
        for line in s.lines() {
            assert!(str_width(line) <= 80, "{line}");
        }
        let joined: String = s
            .lines()
            .filter(|l| l.starts_with('│'))
            .map(|l| l.split('│').nth(1).unwrap().trim())
            .collect();
        assert_eq!(joined, "opensandbox:50953498-6542-4e36-9928-3bd3a2f5e7e6");
        assert!(!s.contains('…'));
    }

    #[test]
    fn words_wrap_at_spaces() {
        assert_eq!(
            wrap("sandbox(lifecycle) exec(run,stream) pty", 20),
            vec!["sandbox(lifecycle)", "exec(run,stream) pty"]
        );
        assert_eq!(
            wrap("sandbox(lifecycle,timeout,pause) pty", 16),
            vec!["sandbox(", "lifecycle,", "timeout,pause)", "pty"]
        );
        assert_eq!(
            wrap("/workspace/a/b.txt", 12),
            vec!["/workspace/", "a/b.txt"]
        );
        assert_eq!(wrap("abcdefgh", 3), vec!["abc", "def", "gh"]);
        assert_eq!(wrap("", 3), vec![""]);
        assert_eq!(wrap("a\nb", 3), vec!["a", "b"]);
    }

    #[test]
    fn wide_characters_count_twice() {
        assert_eq!(str_width("开源沙箱"), 8);
        assert_eq!(str_width("é"), 1);
        let mut t = Table::new(["Name"]);
        t.row(["开源"]);
        let s = t.render(None);
        assert!(s.contains("│ 开源 │"), "{s}");
    }
}
