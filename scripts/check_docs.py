#!/usr/bin/env python3
"""Checks that the reference docs name only things that exist (issue 48).

Scans docs/DESIGN.md and README.md under --root for:
  - backticked repository paths: a token of an inline code span that contains a '/' and starts
    with src/, tests/, docs/, scripts/, tools/, jobs/, inputs/, results/, bench/ or .ci/, or
    ends in .md, .h, .cpp, .sh or .py. It must exist, looked up from the root and then under
    src/ (the docs name source files relative to src/, e.g. `balance/plan.h`). A glob or
    placeholder path (`tests/unit/test_*.cpp`, `results/ppbench_<model>.h5`, `a/.../b`) is
    checked for its directory part only, up to the first '*', '<', '>', '{', '[' or '...';
    a token with no such directory part is skipped. Fenced code blocks are not scanned for
    paths (they hold example commands with placeholder files);
  - backticked `ppbench <command>` commands (also `build/ppbench <command>`): <command> must be
    a subcommand registered in src/app/*.cpp (add_subcommand("name", ...));
  - completeness: every registered subcommand is named as `ppbench <command>` in each file, and
    every folder directly under src/ has a line `src/<folder>/` in each file's layout block;
  - references "§ YYYY-MM-DD topic" (to docs/MEASUREMENTS.md): a heading "## YYYY-MM-DD topic"
    of docs/MEASUREMENTS.md must begin the text that follows the date;
  - size: docs/DESIGN.md at most 500 lines.

Exit status 0 when every check passes, 1 with every problem listed (file:line), 2 on bad usage.
`--selftest` runs the checks on temporary trees and exits 0 when they behave as documented.
Python 3 standard library only.
"""

import argparse
import os
import re
import sys
import tempfile

DOCS = ("docs/DESIGN.md", "README.md")
MEASUREMENTS = "docs/MEASUREMENTS.md"
DESIGN_MAX_LINES = 500
PATH_PREFIXES = ("src/", "tests/", "docs/", "scripts/", "tools/", "jobs/", "inputs/", "results/",
                 "bench/", ".ci/")
PATH_SUFFIXES = (".md", ".h", ".cpp", ".sh", ".py")
PLACEHOLDER = re.compile(r"\*|<|>|\{|\[|\.\.\.|…")
COMMAND = re.compile(r"(?<![\w-])ppbench\s+([A-Za-z][\w-]*)")
SUBCOMMAND = re.compile(r'add_subcommand\(\s*"([^"]+)"')
MEASUREMENT_REF = re.compile(r"§\s+(\d{4}-\d{2}-\d{2})\s+")
HEADING = re.compile(r"^##\s+(\d{4}-\d{2}-\d{2})\s+(.+?)\s*$", re.M)
FENCE = re.compile(r"^\s*(```|~~~)")


def blank_fences(text):
    """The text with every fenced code block's lines blanked (newlines kept, so offsets and line
    numbers stay), and the fenced blocks' lines as (line number, line) pairs."""
    out, fenced, inside = [], [], False
    for no, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            out.append("")
            continue
        if inside:
            fenced.append((no, line))
            out.append("")
        else:
            out.append(line)
    return "\n".join(out), fenced


def inline_spans(text):
    """(offset, content) of every inline code span that does not cross a blank line."""
    for m in re.finditer(r"`([^`]+)`", text):
        if re.search(r"\n\s*\n", m.group(1)):
            continue
        yield m.start(1), m.group(1)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def looks_like_path(token):
    return "/" in token and (token.startswith(PATH_PREFIXES) or token.endswith(PATH_SUFFIXES))


def checked_part(token):
    """The part of a path token to look up, or None to skip it: a ':line' or '#anchor' suffix and
    trailing punctuation dropped, a glob or placeholder cut to its directory part."""
    token = re.sub(r"(:\d+(-\d+)?|#.*)$", "", token).rstrip(".,;:)")
    m = PLACEHOLDER.search(token)
    if m:
        cut = token[:m.start()]
        token = cut[:cut.rfind("/") + 1] if "/" in cut else ""
    return token.rstrip("/") or None


def path_exists(root, path):
    return any(os.path.exists(os.path.join(base, path)) for base in (root, os.path.join(root, "src")))


def subcommands(root):
    names, app = [], os.path.join(root, "src", "app")
    if os.path.isdir(app):
        for name in sorted(os.listdir(app)):
            if name.endswith(".cpp"):
                with open(os.path.join(app, name), encoding="utf-8") as f:
                    names += SUBCOMMAND.findall(f.read())
    return sorted(set(names))


def src_folders(root):
    src = os.path.join(root, "src")
    if not os.path.isdir(src):
        return []
    return sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)) and not d.startswith("."))


def measurement_headings(root):
    path = os.path.join(root, MEASUREMENTS)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return [(d, t) for d, t in HEADING.findall(f.read())]


def check_file(root, rel, commands, folders, headings, stats):
    """The problems of one doc, as 'file:line: message' strings."""
    problems = []
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        text = f.read()
    prose, fenced = blank_fences(text)
    named = set()
    for offset, span in inline_spans(prose):
        line = line_of(prose, offset)
        for m in COMMAND.finditer(span):
            stats["commands"] += 1
            named.add(m.group(1))
            if m.group(1) not in commands:
                problems.append(f"{rel}:{line}: command `ppbench {m.group(1)}` is not registered "
                                f"(src/app/*.cpp add_subcommand: {', '.join(commands) or 'none'})")
        for token in span.split():
            if not looks_like_path(token):
                continue
            part = checked_part(token)
            if part is None:
                continue
            stats["paths"] += 1
            if not path_exists(root, part):
                shown = token if part == token else f"{token}` (directory `{part}/"
                problems.append(f"{rel}:{line}: path `{shown}` does not exist (from the root or src/)")
    for cmd in commands:
        if cmd not in named:
            problems.append(f"{rel}: registered command `ppbench {cmd}` is never named (backticked)")
    layout = {m.group(1) for _, l in fenced for m in [re.match(r"\s*src/([\w.-]+)/", l)] if m}
    for folder in folders:
        if folder not in layout:
            problems.append(f"{rel}: folder src/{folder}/ is missing from the layout block")
    for m in MEASUREMENT_REF.finditer(prose):
        stats["references"] += 1
        line = line_of(prose, m.start())
        date = m.group(1)
        rest = re.sub(r"\s+", " ", prose[m.end():m.end() + 200])
        if headings is None:
            problems.append(f"{rel}:{line}: refers to § {date} but {MEASUREMENTS} does not exist")
        elif not any(d == date and rest.startswith(t) for d, t in headings):
            dated = [t for d, t in headings if d == date]
            problems.append(f"{rel}:{line}: § {date} {rest[:40]}... matches no heading of {MEASUREMENTS}"
                            f" (that day: {'; '.join(dated) or 'none'})")
    if rel == "docs/DESIGN.md":
        n = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        stats["design_lines"] = n
        if n > DESIGN_MAX_LINES:
            problems.append(f"{rel}: {n} lines, more than {DESIGN_MAX_LINES}")
    return problems


def check(root, out=sys.stdout):
    """Runs every check on the tree at `root`; prints the problems (or a summary) to `out` and
    returns the exit status."""
    commands, folders, headings = subcommands(root), src_folders(root), measurement_headings(root)
    stats = {"paths": 0, "commands": 0, "references": 0, "design_lines": 0}
    problems = []
    for rel in DOCS:
        if not os.path.exists(os.path.join(root, rel)):
            problems.append(f"{rel}: missing")
            continue
        problems += check_file(root, rel, commands, folders, headings, stats)
    for p in problems:
        print(f"check_docs: {p}", file=out)
    if problems:
        print(f"check_docs: {len(problems)} problem(s)", file=out)
        return 1
    print(f"check_docs: ok: {stats['paths']} paths, {stats['commands']} commands "
          f"({len(commands)} registered: {', '.join(commands)}), {stats['references']} references to "
          f"{MEASUREMENTS}, every src/ folder in the layout blocks; DESIGN.md {stats['design_lines']} lines "
          f"(at most {DESIGN_MAX_LINES})", file=out)
    return 0


# ---- self-test ------------------------------------------------------------------------------

def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


GOOD_DESIGN = """# design

Runs `ppbench run` and `build/ppbench profile FILE.h5`; see `src/app/main.cpp`, `balance/plan.h`
(under src/), `tests/unit/test_*.cpp`, `results/ppbench_<model>.h5`, `<stem>_rate.png`,
`/benchmark/<name>/steps`, `src/app/main.cpp:12`, `bash scripts/run.sh --x`, and
`ppbench_plot.py` (no slash). Measured: MEASUREMENTS.md § 2026-12-05 weight
cache, and § 2026-12-04 rate search.

```
src/app/      the CLI
src/balance/  solvers
mpirun ppbench bogus -o results/missing.h5
```
"""

GOOD_README = """# readme

`ppbench run`, `ppbench profile`, `docs/DESIGN.md`, `scripts/run.sh`.

```
src/app/      the CLI
src/balance/  solvers
```
"""

MAIN_CPP = """int main() {
  app.add_subcommand("run", "x");
  auto* p = app.add_subcommand(
      "profile", "y");
}
"""

MEASUREMENTS_MD = """# journal

## 2026-12-04 rate search

text

## 2026-12-05 weight cache

text
"""


def make_tree(root):
    write(root, "src/app/main.cpp", MAIN_CPP)
    write(root, "src/balance/plan.h", "")
    write(root, "tests/unit/test_a.cpp", "")
    write(root, "results/README.md", "")
    write(root, "scripts/run.sh", "")
    write(root, "docs/DESIGN.md", GOOD_DESIGN)
    write(root, "docs/MEASUREMENTS.md", MEASUREMENTS_MD)
    write(root, "README.md", GOOD_README)


class Sink:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s


def expect(name, root, status, needles=(), absent=()):
    sink = Sink()
    got = check(root, sink)
    ok = got == status and all(n in sink.text for n in needles) and not any(a in sink.text for a in absent)
    print(f"selftest {name}: {'ok' if ok else 'FAILED'}")
    if not ok:
        print(f"  status {got} (wanted {status}); output:\n" + "".join("    " + l + "\n" for l in sink.text.splitlines()))
    return ok


def selftest():
    results = []
    with tempfile.TemporaryDirectory() as root:
        make_tree(root)
        results.append(expect("a good tree passes", root, 0, ["check_docs: ok", "2 registered: profile, run"]))

        write(root, "docs/DESIGN.md", GOOD_DESIGN + "\nAlso `ppbench frobnicate` and `src/app/gone.cpp`, "
              "`balance/none.h`, `tests/nothere/test_*.cpp`, `x.cpp`.\n")
        results.append(expect("missing paths and commands fail", root, 1,
                              ["`ppbench frobnicate` is not registered", "`src/app/gone.cpp` does not exist",
                               "`balance/none.h` does not exist", "directory `tests/nothere/",
                               "DESIGN.md:15:"],
                              ["`x.cpp`", "bogus", "missing.h5"]))

        write(root, "docs/DESIGN.md", GOOD_DESIGN + "\n" * 500)
        results.append(expect("a DESIGN.md over 500 lines fails", root, 1, ["lines, more than 500"]))

        write(root, "docs/DESIGN.md", GOOD_DESIGN.replace("`build/ppbench profile FILE.h5`", "profile"))
        results.append(expect("an unnamed subcommand fails", root, 1,
                              ["docs/DESIGN.md: registered command `ppbench profile` is never named"]))

        write(root, "docs/DESIGN.md", GOOD_DESIGN)
        os.makedirs(os.path.join(root, "src", "serving"))
        results.append(expect("a src/ folder missing from a layout block fails", root, 1,
                              ["README.md: folder src/serving/ is missing", "DESIGN.md: folder src/serving/"]))
        os.rmdir(os.path.join(root, "src", "serving"))

        write(root, "docs/DESIGN.md", GOOD_DESIGN.replace("§ 2026-12-04 rate search", "§ 2026-12-04 rate hunt"))
        results.append(expect("a reference to no journal heading fails", root, 1,
                              ["§ 2026-12-04 rate hunt", "that day: rate search"]))

        write(root, "docs/DESIGN.md", GOOD_DESIGN)
        write(root, "src/app/main.cpp", MAIN_CPP.replace('"profile"', '"profile2"'))
        results.append(expect("a command no longer registered fails", root, 1,
                              ["`ppbench profile` is not registered"]))
    failed = results.count(False)
    print(f"selftest: {len(results) - failed} of {len(results)} passed")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="repository root (default: this script's parent folder's parent)")
    parser.add_argument("--selftest", action="store_true", help="test this checker on temporary trees")
    args = parser.parse_args()
    if args.selftest:
        return selftest()
    if not os.path.isdir(args.root):
        print(f"check_docs: --root {args.root}: not a directory", file=sys.stderr)
        return 2
    return check(args.root)


if __name__ == "__main__":
    sys.exit(main())
