#!/usr/bin/env python3
"""Checks the size limits of src/ (issue 34): no source file over 900 lines, no function over
100 lines (CUDA kernels, `__global__` functions, excepted), no `#if PPBENCH_HAVE_CUDA` in the
layers that must stay backend-neutral.

Usage: scripts/check_code_size.py [--root DIR] [--max-function N] [--max-file N] [--list N]
  exit 0: within limits; 1: a limit broken (each offender printed as file:line: what).
  --list N prints the N longest functions (a report, whatever the limits).

A function is found by its braces: comments, string and character literals are blanked first,
then every `{` is classified by the text before it since the previous `;`, `{` or `}`: a
namespace, a class/struct/union/enum body, `extern "C"`, or a function body when that text
holds a parameter list `(...)` and is not a control statement (if/for/while/switch/catch/do),
a lambda (`](...)` or `] {`) or an initializer. Functions nested in a function (lambdas, local
classes) count towards the enclosing function, as they are read with it. Its length is from
the line of its name's signature to its closing brace, inclusive. Plain Python 3, no parser
library: exact enough for this code base's style (clang-format'ed), verified by
`--selftest`.
"""
import argparse
import os
import re
import sys

SOURCE_EXT = (".cpp", ".h", ".cu", ".cuh", ".cpp.in")
NEUTRAL_DIRS = ("src/app", "src/run", "src/pipeline", "src/profile")


def blank_literals(text):
    """Returns text with comments, string and char literals replaced by spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def blank_preprocessor(text):
    """Blanks preprocessor lines (with their continuations)."""
    lines = text.split("\n")
    cont = False
    for k, line in enumerate(lines):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            lines[k] = ""
        else:
            cont = False
    return "\n".join(lines)


FUNCTION_TAIL = re.compile(
    r"\)\s*(?:const|noexcept\s*\([^)]*\)|noexcept|override|final|mutable|volatile|&&|&|\s)*"
    r"(?:->\s*[^{;]*)?$")


def classify(head):
    """Kind of a block opened at namespace or class scope, from the text since the previous
    `;`, `{` or `}`: namespace, class, function, init (a brace initializer inside a
    constructor's member-initializer list, whose head goes on) or other (an initializer)."""
    h = " ".join(head.split())
    if re.search(r"(^|\s)namespace(\s|$)", h) or h.startswith('extern "'):
        return "namespace"
    if re.search(r"\)\s*:\s*\S", h) and re.search(r"[\w>]$", h) and "?" not in h:
        return "init"  # S::S(int x) : v_{ ... the member v_'s braces
    if FUNCTION_TAIL.search(h) or re.search(r"\)\s*:\s*\S.*\)$", h):
        if "=" in h.split("(")[0] and not re.search(r"operator\s*\S*=", h):
            return "other" if "[" not in h else "function"  # a lambda bound to a name
        return "function"
    if re.search(r"(^|[\s>])(class|struct|union|enum)(\s|$)", h):
        return "class"
    return "other"


def functions(text):
    """Yields (first_line, last_line, name) of each outermost function body in text."""
    clean = blank_preprocessor(blank_literals(text))
    stack = []  # (kind, start_line, name)
    head_start = 0
    line = 1
    for i, c in enumerate(clean):
        if c == "\n":
            line += 1
            continue
        if c not in ";{}":
            continue
        if c == "{":
            head = clean[head_start:i]
            scope_open = all(k in ("namespace", "class") for k, _, _ in stack)
            kind = classify(head) if scope_open else "nested"
            start, name = line, ""
            if kind == "function":
                m = re.search(r"((?:[\w:~]+::)?(?:operator\s*[^\s(]+|[\w~]+))\s*\(", head)
                name = m.group(1) if m else "?"
                offset = len(head) - len(head.lstrip())
                start = clean.count("\n", 0, head_start + offset) + 1
            stack.append((kind, start, name))
            if kind == "init":
                continue  # the constructor's head goes on after this initializer
        elif c == "}" and stack:
            kind, start, name = stack.pop()
            if kind == "function":
                yield start, line, name
            if kind == "init":
                continue
        head_start = i + 1


def is_kernel(text, start, path):
    """Whether the function starting at line `start` is a CUDA kernel (__global__)."""
    if not path.endswith((".cu", ".cuh")):
        return False
    lines = text.split("\n")
    window = "\n".join(lines[max(0, start - 3):start + 2])
    return "__global__" in window


def scan(root, max_function, max_file):
    problems, all_functions = [], []
    for base, _, names in os.walk(os.path.join(root, "src")):
        for name in sorted(names):
            if not name.endswith(SOURCE_EXT):
                continue
            path = os.path.join(base, name)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            n_lines = text.count("\n")
            if n_lines > max_file:
                problems.append(f"{rel}:1: file of {n_lines} lines (limit {max_file})")
            if rel.startswith(NEUTRAL_DIRS):
                for k, line in enumerate(text.split("\n"), 1):
                    if re.match(r"\s*#\s*(if|ifdef|elif)\b.*PPBENCH_HAVE_CUDA", line):
                        problems.append(f"{rel}:{k}: #if PPBENCH_HAVE_CUDA outside the "
                                        "backend and transport layers")
            for start, end, fname in functions(text):
                length = end - start + 1
                kernel = is_kernel(text, start, path)
                all_functions.append((length, rel, start, fname, kernel))
                if length > max_function and not kernel:
                    problems.append(f"{rel}:{start}: function {fname} of {length} lines "
                                    f"(limit {max_function})")
    return problems, all_functions


SELFTEST = r'''
namespace a {
struct S {
  int f() const { return 1; }
};
// a comment with { braces
int g(int x) {
  const char* s = "}{";
  auto l = [&](int y) {
    return y + x;
  };
  if (x) {
    for (int i = 0; i < 3; ++i) {
    }
  } else {
  }
  return l(2);
}
S::S(int x) : v_{x}, w_(x) {
  v_ = 2;
}
}  // namespace a
'''


def selftest():
    got = [(s, e, n) for s, e, n in functions(SELFTEST)]
    want = [(4, 4, "f"), (7, 18, "g"), (19, 21, "S::S")]
    if got != want:
        print(f"selftest: got {got}, want {want}")
        return 1
    print("selftest: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--max-function", type=int, default=100)
    ap.add_argument("--max-file", type=int, default=900)
    ap.add_argument("--list", type=int, default=0, help="print the N longest functions")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    problems, found = scan(os.path.abspath(args.root), args.max_function, args.max_file)
    if args.list:
        for length, rel, start, fname, kernel in sorted(found, reverse=True)[:args.list]:
            print(f"{length:5d}  {rel}:{start}  {fname}{'  (kernel)' if kernel else ''}")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} size limit(s) broken")
        return 1
    print(f"check_code_size: {len(found)} functions within {args.max_function} lines, "
          f"files within {args.max_file} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
