//! The check that holds set-up's program table ([`crate::setup::PROGRAMS`])
//! to the sources: a scan of the Rust files under `tests/` for the
//! programs they start, and a unit test that fails when one of them is not
//! in the table, so a tool installed by hand on one machine cannot hide a
//! missing install step.

/// Reads Rust sources for the programs they start. Found:
///
/// - `Command::new("x")`, and the harness's spawning helpers called with a
///   literal program: `run("x", …)` and `tool("x")`;
/// - `ip netns exec NAME x …` in a literal argument array;
/// - shell scripts given as a literal after `"-c"` to `Command::new("sh")`
///   (or `bash`): the first word of each command (after `exec` and
///   `nsenter`'s options; shell built-ins are not programs), and where the
///   script runs its arguments (`"$@"`, `"$3"`), the literal passed at
///   that position by the `.arg`/`.args` calls that follow.
///
/// A program named by a variable (`Command::new(bin)`) is not seen; the
/// ones built by this workspace (the daemon, the hyper floor) are started
/// that way.
#[cfg(test)]
pub mod scan {
    /// A token of Rust source, as far as the scan needs one.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Token {
        Str(String),
        Word(String),
        Punct(char),
    }

    /// Splits Rust source into string literals, words and punctuation;
    /// comments, char literals and lifetimes are dropped.
    pub fn tokens(src: &str) -> Vec<Token> {
        let b: Vec<char> = src.chars().collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c == '/' && b.get(i + 1) == Some(&'/') {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            } else if c == '/' && b.get(i + 1) == Some(&'*') {
                i += 2;
                while i + 1 < b.len() && !(b[i] == '*' && b[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            } else if c == 'r' && matches!(b.get(i + 1), Some('"') | Some('#')) && raw_start(&b, i + 1) {
                let mut j = i + 1;
                let mut hashes = 0;
                while b[j] == '#' {
                    hashes += 1;
                    j += 1;
                }
                j += 1; // the opening quote
                let start = j;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                        break;
                    }
                    j += 1;
                }
                out.push(Token::Str(b[start..j.min(b.len())].iter().collect()));
                i = j + 1 + hashes;
            } else if c == '"' {
                let mut s = String::new();
                i += 1;
                while i < b.len() && b[i] != '"' {
                    if b[i] == '\\' && i + 1 < b.len() {
                        i += 1;
                        match b[i] {
                            'n' => s.push('\n'),
                            't' => s.push('\t'),
                            '\n' => {
                                // A continued line: the next line's indent is dropped.
                                while i + 1 < b.len() && b[i + 1].is_whitespace() {
                                    i += 1;
                                }
                            }
                            other => s.push(other),
                        }
                    } else {
                        s.push(b[i]);
                    }
                    i += 1;
                }
                out.push(Token::Str(s));
                i += 1;
            } else if c == '\'' {
                // A char literal ('x', '\n') or a lifetime ('a).
                if b.get(i + 1) == Some(&'\\') {
                    i += 2;
                    while i < b.len() && b[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if b.get(i + 2) == Some(&'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            } else if c.is_alphanumeric() || c == '_' {
                let start = i;
                while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
                out.push(Token::Word(b[start..i].iter().collect()));
            } else {
                if !c.is_whitespace() {
                    out.push(Token::Punct(c));
                }
                i += 1;
            }
        }
        out
    }

    fn raw_start(b: &[char], mut i: usize) -> bool {
        while b.get(i) == Some(&'#') {
            i += 1;
        }
        b.get(i) == Some(&'"')
    }

    fn word(t: Option<&Token>, w: &str) -> bool {
        matches!(t, Some(Token::Word(x)) if x == w)
    }

    fn punct(t: Option<&Token>, p: char) -> bool {
        t == Some(&Token::Punct(p))
    }

    fn string(t: Option<&Token>) -> Option<&str> {
        match t {
            Some(Token::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// The programs `src` starts, in order of appearance (repeats kept).
    pub fn programs(src: &str) -> Vec<String> {
        let t = tokens(src);
        let mut found = Vec::new();
        for i in 0..t.len() {
            // Command::new("x")
            if word(t.get(i), "Command")
                && punct(t.get(i + 1), ':')
                && punct(t.get(i + 2), ':')
                && word(t.get(i + 3), "new")
                && punct(t.get(i + 4), '(')
                && let Some(program) = string(t.get(i + 5))
            {
                found.push(program.to_owned());
                if program == "sh" || program == "bash" {
                    // `let mut cmd = Command::new("sh"); cmd.arg("-c")…`:
                    // the chain goes on in statements on the same binding.
                    let binding =
                        match (i.checked_sub(2).and_then(|j| t.get(j)), i.checked_sub(1).map(|j| &t[j])) {
                            (Some(Token::Word(name)), Some(Token::Punct('='))) => Some(name.as_str()),
                            _ => None,
                        };
                    found.extend(script_programs(&t[i + 6..], binding));
                }
            }
            // run("x", …) and tool("x"), called as functions, not methods.
            if (word(t.get(i), "run") || word(t.get(i), "tool"))
                && !punct(i.checked_sub(1).and_then(|j| t.get(j)), '.')
                && !word(i.checked_sub(1).and_then(|j| t.get(j)), "fn")
                && punct(t.get(i + 1), '(')
                && let Some(program) = string(t.get(i + 2))
            {
                found.push(program.to_owned());
            }
            // "netns", "exec", NAME, "x"
            if string(t.get(i)) == Some("netns")
                && punct(t.get(i + 1), ',')
                && string(t.get(i + 2)) == Some("exec")
                && punct(t.get(i + 3), ',')
            {
                // NAME may be an expression: the program is the first
                // literal after its comma.
                let mut j = i + 4;
                while j < t.len() && !punct(t.get(j), ',') && !punct(t.get(j), ']') {
                    j += 1;
                }
                if punct(t.get(j), ',')
                    && let Some(program) = string(t.get(j + 1))
                {
                    found.push(program.to_owned());
                }
            }
        }
        found
    }

    /// The arguments a `.arg(…)`/`.args([…])` chain passes, up to the end
    /// of its statement: `Some(literal)` or `None` for an expression.
    /// Stops at an `.args(x)` whose length cannot be known.
    fn chain_args(t: &[Token], binding: Option<&str>) -> Vec<Option<String>> {
        let mut args = Vec::new();
        let mut i = 0;
        while i < t.len() {
            if punct(t.get(i), ';') {
                match binding {
                    Some(name) if word(t.get(i + 1), name) && punct(t.get(i + 2), '.') => {}
                    _ => break,
                }
            }
            if punct(t.get(i), '.') && (word(t.get(i + 1), "arg") || word(t.get(i + 1), "args")) {
                let many = word(t.get(i + 1), "args");
                let mut j = i + 3; // past `(`
                if many {
                    if !(punct(t.get(j), '[') || punct(t.get(j), '&') && punct(t.get(j + 1), '[')) {
                        return args;
                    }
                    while !punct(t.get(j), '[') {
                        j += 1;
                    }
                    j += 1;
                }
                // Items separated by commas at depth 0 until the closer.
                let mut depth = 0;
                let mut item: Vec<&Token> = Vec::new();
                while j < t.len() {
                    let tok = &t[j];
                    match tok {
                        Token::Punct('(' | '[' | '{') => depth += 1,
                        Token::Punct(')' | ']' | '}') if depth == 0 => break,
                        Token::Punct(')' | ']' | '}') => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 && punct(Some(tok), ',') {
                        args.push(literal(&item));
                        item.clear();
                    } else {
                        item.push(tok);
                    }
                    j += 1;
                }
                if !item.is_empty() {
                    args.push(literal(&item));
                }
                i = j;
            }
            i += 1;
        }
        args
    }

    fn literal(item: &[&Token]) -> Option<String> {
        match item {
            [Token::Str(s)] => Some(s.clone()),
            _ => None,
        }
    }

    /// Programs of the script passed after `"-c"` in the chain `t`.
    fn script_programs(t: &[Token], binding: Option<&str>) -> Vec<String> {
        let args = chain_args(t, binding);
        let Some(at) = args.iter().position(|a| a.as_deref() == Some("-c")) else { return vec![] };
        let Some(Some(script)) = args.get(at + 1) else { return vec![] };
        let positional = &args[at + 2..];
        let mut found = Vec::new();
        let mut shifts = 0;
        for command in commands(script) {
            let mut words = command.iter().map(String::as_str).peekable();
            while let Some(&w) = words.peek() {
                if w == "exec" || w.contains('=') && !w.starts_with('-') {
                    words.next(); // `exec`, or an assignment before the command
                } else {
                    break;
                }
            }
            let Some(first) = words.next() else { continue };
            if first == "shift" {
                shifts += 1;
                continue;
            }
            let (program, index) = match first {
                "nsenter" => match words.find(|w| !w.starts_with('-') || w.contains("\"$@\"")) {
                    // `--net="$@"`: the namespace is the first of "$@", the
                    // program the next.
                    Some(w) if w.starts_with('-') => (Some("nsenter".to_owned()), Some(shifts + 2)),
                    Some(w) => {
                        found.push("nsenter".to_owned());
                        resolve(w, shifts)
                    }
                    None => (Some("nsenter".to_owned()), None),
                },
                other => resolve(other, shifts),
            };
            if let Some(p) = program
                && !BUILTINS.contains(&p.as_str())
            {
                found.push(p);
            }
            if let Some(Some(Some(p))) = index.map(|n| positional.get(n)) {
                found.push(p.clone());
            }
        }
        found
    }

    /// A command word: a program's name, or a positional argument's index
    /// (`"$@"` after `shifts` shifts is argument `shifts + 1`).
    fn resolve(word: &str, shifts: usize) -> (Option<String>, Option<usize>) {
        let bare = word.trim_matches('"');
        if bare == "$@" {
            (None, Some(shifts + 1))
        } else if let Some(n) = bare.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
            (None, Some(n))
        } else if bare.starts_with('$') {
            (None, None)
        } else {
            (Some(bare.to_owned()), None)
        }
    }

    /// Shell built-ins and keywords: started by the shell, not from PATH.
    const BUILTINS: &[&str] = &[
        "cd", "command", "exit", "export", "set", "shift", "trap", "wait", "read", "true", "false", "if",
        "then", "else", "fi", "for", "do", "done", "while", "until", "test", "[", "local", "return", ":",
    ];

    /// A script's simple commands as words, split at `&&`, `||`, `;`, `|`
    /// and newlines outside quotes (quotes kept in the words).
    fn commands(script: &str) -> Vec<Vec<String>> {
        let mut commands = vec![Vec::new()];
        let mut word = String::new();
        let mut quote = None;
        let chars: Vec<char> = script.chars().collect();
        let mut i = 0;
        let end_word = |word: &mut String, commands: &mut Vec<Vec<String>>| {
            if !word.is_empty() {
                commands.last_mut().expect("one").push(std::mem::take(word));
            }
        };
        while i < chars.len() {
            let c = chars[i];
            match quote {
                Some(q) => {
                    word.push(c);
                    if c == q {
                        quote = None;
                    }
                }
                None if c == '"' || c == '\'' => {
                    word.push(c);
                    quote = Some(c);
                }
                None if c == ';' || c == '|' || c == '&' || c == '\n' || c == '(' || c == ')' => {
                    end_word(&mut word, &mut commands);
                    commands.push(Vec::new());
                    if i + 1 < chars.len() && chars[i + 1] == c {
                        i += 1;
                    }
                }
                None if c.is_whitespace() => end_word(&mut word, &mut commands),
                None if c == '>' || c == '<' => {
                    // A redirection's target is not a command word.
                    end_word(&mut word, &mut commands);
                    // `>>`, `>&2`, `2>&1`: the operator's own characters.
                    while i + 1 < chars.len() && (chars[i + 1] == '>' || chars[i + 1] == '&') {
                        i += 1;
                    }
                    while i + 1 < chars.len() && chars[i + 1].is_whitespace() {
                        i += 1;
                    }
                    while i + 1 < chars.len()
                        && !chars[i + 1].is_whitespace()
                        && !";|&".contains(chars[i + 1])
                    {
                        i += 1;
                    }
                }
                None => word.push(c),
            }
            i += 1;
        }
        end_word(&mut word, &mut commands);
        commands.retain(|c| !c.is_empty());
        commands
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, fs, path::Path};

    use super::scan::programs;
    use crate::setup::PROGRAMS;

    /// Every `.rs` file under `dir`, recursively.
    fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The programs started under `tests/` that the table lacks, with the
    /// files that start them.
    fn unlisted(table: &[&str]) -> BTreeMap<String, Vec<String>> {
        let root = crate::root();
        let mut files = Vec::new();
        sources(&root.join("tests"), &mut files);
        assert!(files.len() > 20, "the test sources: {files:?}");
        let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for file in files {
            let src = fs::read_to_string(&file).unwrap();
            for program in programs(&src) {
                if !table.contains(&program.as_str()) {
                    let at = file.strip_prefix(&root).unwrap().display().to_string();
                    missing.entry(program).or_default().push(at);
                }
            }
        }
        missing
    }

    #[test]
    fn every_program_the_tests_benchmarks_and_soak_start_is_in_the_table() {
        let table: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
        let missing = unlisted(&table);
        assert!(
            missing.is_empty(),
            "programs started under tests/ that xtask/src/setup.rs (PROGRAMS) does not list (so set-up would not install them): {missing:?}"
        );
    }

    #[test]
    fn a_program_dropped_from_the_table_is_caught() {
        // The test above is not vacuous: each of these is started by the
        // suite in one of the ways the scan knows, and leaving it out of
        // the table is reported.
        for dropped in ["promtool", "systemd-socket-activate", "ethtool", "nsenter", "h2load", "tmux"] {
            let table: Vec<&str> = PROGRAMS.iter().map(|p| p.name).filter(|n| *n != dropped).collect();
            assert!(
                unlisted(&table).contains_key(dropped),
                "{dropped} dropped from the table went unnoticed"
            );
        }
    }

    #[test]
    fn the_table_names_no_program_twice() {
        let mut names: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a program listed twice");
    }

    #[test]
    fn the_scan_finds_each_way_of_starting_a_program() {
        let src = r##"
            // Command::new("not-a-program") in a comment
            let a = Command::new("alpha").arg("-c").arg("x");
            run("beta", &["netns", "exec", &sb.name, "gamma", "-x"]);
            let t = tool("delta");
            fn run(cmd: &str) {}
            self.run("not-a-program");
            let mut s = Command::new("sh");
            s.arg("-c")
                .arg(r#"echo $$ > "$1/cgroup.procs" && shift && exec nsenter --net="$@""#)
                .arg("sh")
                .arg(&cgroup)
                .arg(&netns)
                .args(["epsilon", "-l", "x"]);
            Command::new("sh").args(["-c", "FOO=1 zeta --flag | eta; cd /; exec \"$0\" run"]).arg("theta");
            let c = 'x';
            Command::new(variable);
        "##;
        assert_eq!(
            programs(src),
            [
                "alpha", "beta", "gamma", "delta", "sh", "echo", "nsenter", "epsilon", "sh", "zeta", "eta",
                "theta"
            ]
        );
    }
}
