"""The docs against the binary and against themselves (issue #17).

- Every `--flag` that `hutch run --help` and `hutch serve --help` list is
  accepted by that verb's parser: `hutch VERB --FLAG VALUE --help` parses the
  flag (and its value) before it reaches `--help`, so a flag the parser does
  not know, or a value it refuses, exits 2 instead of 0. No sandbox and no
  daemon is started.
- Every `--flag` that README.md or docs/*.md show for `hutch run` or
  `hutch serve` is one that verb's `--help` lists; the README's synopsis of
  `hutch run` and docs/api.md's settings table list all of them.
- Nothing in the repository points outside it (the design and protocol notes
  it once cited lived in a folder users do not have), and references to
  sections of docs/design.md, docs/protocol.md and docs/security.md name
  sections that exist.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

import hutchtest

ROOT = hutchtest.REPO_ROOT
DOCS = sorted((ROOT / "docs").glob("*.md"))
USER_DOCS = [ROOT / "README.md"] + DOCS

FLAG = r"--([a-z][a-z0-9-]*)"


def _hutch(hutch_bin, *args, timeout=30):
    return subprocess.run([str(hutch_bin), *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------- --help output

def _help(hutch_bin, verb):
    cp = _hutch(hutch_bin, verb, "--help")
    assert cp.returncode == 0, (verb, cp.returncode, cp.stderr)
    return cp.stdout


def run_help_flags(hutch_bin):
    """{flag: metavar or None} from `hutch run --help`'s option lines
    ("  --memory SIZE   memory limit...", "  --json   print...")."""
    flags = {}
    for line in _help(hutch_bin, "run").splitlines():
        m = re.match(r"^  " + FLAG + r"(?: (\S+))?(\s+|$)", line)
        if not m:
            continue
        # a metavar is one space after the flag: SIZE, K=V, ns|gvisor, CIDR,...
        meta = m.group(2)
        if meta and not (re.fullmatch(r"[A-Z][A-Z0-9_=.,]*", meta) or "|" in meta):
            meta = None
        flags[m.group(1)] = meta
    assert len(flags) >= 10, flags
    return flags


def serve_help_flags(hutch_bin):
    """{setting: default} from `hutch serve --help`, which prints the
    configuration table of daemon/server.c, plus --config from its usage."""
    text = _help(hutch_bin, "serve")
    flags = {}
    for line in text.splitlines():
        m = re.match(r"^  " + FLAG + r"\s.*\(default (.*)\)$", line)
        if m:
            flags[m.group(1)] = m.group(2)
    assert len(flags) >= 20, flags
    assert "[--config FILE]" in text.splitlines()[0]
    return flags


# A value each metavar of `hutch run --help` accepts.
RUN_SAMPLES = {
    "SIZE": "64M",
    "N": "64",  # valid for --pids, --cpus and --inodes (at least 64)
    "NAME": "host",
    "POLICY": "deny",
    "CIDR,...": "10.0.0.0/8",
    "IP,...": "192.0.2.53",
    "K=V": "HUTCH_DOCS=1",
    "DIR": "/tmp",
    "DURATION": "1s",
}


def _run_sample(meta):
    if "|" in meta:
        return meta.split("|")[0]  # ns|gvisor, user|root|UID
    assert meta in RUN_SAMPLES, (f"`hutch run --help` shows a metavar {meta!r} that "
                                 "test_docs.py has no sample value for: add one")
    return RUN_SAMPLES[meta]


def test_every_run_flag_in_help_is_accepted(hutch_bin):
    for flag, meta in run_help_flags(hutch_bin).items():
        args = ["run", f"--{flag}"] + ([_run_sample(meta)] if meta else []) + ["--help"]
        cp = _hutch(hutch_bin, *args)
        assert cp.returncode == 0 and cp.stdout.startswith("usage: hutch run"), (
            f"`hutch {' '.join(args)}` exits {cp.returncode}: {cp.stderr.strip()}")


def test_every_serve_setting_in_help_is_accepted(hutch_bin, tmp_path):
    for flag, default in serve_help_flags(hutch_bin).items():
        # the default is a valid value; empty lists are allowed as such
        for args in (["serve", f"--{flag}", default, "--help"],
                     ["serve", f"--{flag}={default}", "--help"]):
            cp = _hutch(hutch_bin, *args)
            assert cp.returncode == 0 and cp.stdout.startswith("usage: hutch serve"), (
                f"`hutch {' '.join(args)}` exits {cp.returncode}: {cp.stderr.strip()}")
    conf = tmp_path / "hutch.conf"
    conf.write_text("# a comment\nlisten = 127.0.0.1:49999\npool-size = 0\n")
    cp = _hutch(hutch_bin, "serve", "--config", str(conf), "--help")
    assert cp.returncode == 0, cp.stderr


def test_the_probes_reach_the_parsers(hutch_bin, tmp_path):
    """The probes above would prove nothing if --help short-circuited the
    parsers: an unknown flag, and a bad value, must still be refused."""
    for args in (["run", "--no-such-flag", "--help"],
                 ["run", "--memory", "lots", "--help"],
                 ["serve", "--no-such-setting", "1", "--help"],
                 ["serve", "--memory", "lots", "--help"],
                 ["serve", "--pool-size", "100000", "--help"]):
        cp = _hutch(hutch_bin, *args)
        assert cp.returncode == hutchtest.EXIT_USAGE, (args, cp.returncode, cp.stdout)
    conf = tmp_path / "bad.conf"
    conf.write_text("no-such-setting = 1\n")
    cp = _hutch(hutch_bin, "serve", "--config", str(conf), "--help")
    assert cp.returncode == hutchtest.EXIT_USAGE, cp.stderr


# ------------------------------------------------ flags the docs show per verb

VERB = re.compile(r"\bhutch\s+(run|serve)\b")


def _command_flags(segment):
    """Flags of one `hutch run|serve ...` command line, up to the end of the
    command: a standalone `--` (what follows is the sandbox's command), a
    shell separator, a comment, or the next hutch command."""
    end = re.search(r"\s--(?=\s|$)|&&|;|\s#|\bhutch\s", segment)
    if end:
        segment = segment[:end.start()]
    return re.findall(r"(?<![\w-])" + FLAG, segment)


def _logical_lines(block):
    """Lines of a code block, with continuations joined: a trailing
    backslash, or an indented line going on with `[` or `--` (a synopsis)."""
    out = []  # [index of the first line, text]
    for i, line in enumerate(block):
        if out and (out[-1][1].endswith("\\") or re.match(r"^\s+(\[|--)", line)):
            out[-1][1] = out[-1][1].rstrip("\\") + " " + line.strip()
        else:
            out.append([i, line])
    return out


def doc_flags(path):
    """[(verb, flag, where)] for every flag the file shows with `hutch run`
    or `hutch serve`: in commands (code blocks and `code spans`), in
    `make run RUN_ARGS=...` (serve's), and as bare `--flag` spans in a
    section whose heading names exactly one of the two verbs."""
    found = []
    lines = path.read_text().splitlines()
    section_verb = None
    fence = None
    prose = []

    def scan_prose(chunk, first_line):
        text = "\n".join(chunk)
        for span in re.finditer(r"`([^`]+)`", text, re.S):
            code = span.group(1)
            where = f"{path.name}:{first_line + text[:span.start()].count(chr(10))}"
            hits = list(VERB.finditer(code))
            for m in hits:
                for f in _command_flags(code[m.end():]):
                    found.append((m.group(1), f, where))
            bare = re.match(r"^" + FLAG + r"(?:[ =]\S*)?$", code)
            if not hits and bare and section_verb:
                found.append((section_verb, bare.group(1), where))

    def scan_code(block, first_line):
        for i, line in _logical_lines(block):
            where = f"{path.name}:{first_line + i}"
            for m in VERB.finditer(line):
                for f in _command_flags(line[m.end():]):
                    found.append((m.group(1), f, where))
            for m in re.finditer(r"RUN_ARGS=('[^']*'|\"[^\"]*\"|\S+)", line):
                for f in re.findall(r"(?<![\w-])" + FLAG, m.group(1)):
                    found.append(("serve", f, where))

    start = 1
    for n, line in enumerate(lines, 1):
        if fence is not None:
            if line.startswith("```"):
                scan_code(fence, start)
                fence = None
            else:
                fence.append(line)
            continue
        if line.startswith("```") or line.startswith("#"):
            if prose:
                scan_prose(prose, start)
                prose = []
            if line.startswith("```"):
                fence, start = [], n + 1
                continue
            verbs = set(VERB.findall(line))
            section_verb = verbs.pop() if len(verbs) == 1 else None
            scan_prose([line], n)
            continue
        if not prose:
            start = n
        prose.append(line)
    if prose:
        scan_prose(prose, start)
    return found


def test_flags_in_the_docs_exist(hutch_bin):
    known = {"run": set(run_help_flags(hutch_bin)) | {"help"},
             "serve": set(serve_help_flags(hutch_bin)) | {"config", "help"}}
    seen = {"run": set(), "serve": set()}
    bad = []
    for path in USER_DOCS:
        for verb, flag, where in doc_flags(path):
            seen[verb].add(flag)
            if flag not in known[verb]:
                bad.append(f"{where}: `hutch {verb} --{flag}` is not in `hutch {verb} --help`")
    assert not bad, "\n".join(bad)
    # the extraction itself works: these are in the README and the docs today
    assert {"memory", "net", "json", "backend"} <= seen["run"], seen["run"]
    assert {"listen", "data-dir", "egress-allow", "backend"} <= seen["serve"], seen["serve"]


def test_readme_run_synopsis_lists_every_flag(hutch_bin):
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^hutch run \[.*?-- CMD \[ARG\.\.\.\]$", text, re.S | re.M)
    assert m, "README.md has no `hutch run [...] -- CMD [ARG...]` synopsis"
    listed = set(re.findall(r"\[" + FLAG, m.group(0)))
    assert listed == set(run_help_flags(hutch_bin)), (
        "README.md's `hutch run` synopsis and `hutch run --help` differ: "
        f"only in the README {sorted(listed - set(run_help_flags(hutch_bin)))}, "
        f"only in --help {sorted(set(run_help_flags(hutch_bin)) - listed)}")


def api_settings_table():
    """{setting: default cell} from docs/api.md's settings table; a row may
    name several settings, with their defaults in the same order."""
    text = (ROOT / "docs" / "api.md").read_text()
    m = re.search(r"^\| setting \| default \| what \|\n\|[-|]+\|\n((?:\|.*\n)+)", text, re.M)
    assert m, "docs/api.md has no `| setting | default | what |` table"
    table = {}
    for row in m.group(1).splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`([a-z][a-z0-9-]*)`", cells[0])
        defaults = re.findall(r"`([^`]*)`", cells[1])
        for i, name in enumerate(names):
            table[name] = defaults[i] if len(defaults) == len(names) else None
    return table


def test_api_settings_table_matches_serve_help(hutch_bin):
    helped = serve_help_flags(hutch_bin)
    table = api_settings_table()
    assert set(table) == set(helped), (
        "docs/api.md's settings table and `hutch serve --help` differ: "
        f"only in api.md {sorted(set(table) - set(helped))}, "
        f"only in --help {sorted(set(helped) - set(table))}")
    wrong = [f"{k}: api.md says {v!r}, --help {helped[k]!r}"
             for k, v in table.items() if v is not None and helped[k] and v != helped[k]]
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------- the repository stands alone

SKIP_DIRS = {".git", "node_modules", "var", "subprojects", "corpus", "__pycache__", ".pytest_cache"}
# spelled in pieces, so that this file does not match itself
OUTSIDE = [re.escape(".." + "/shared"), r"(?<![\w./-])" + "shared" + "/",
           *(re.escape(n + ".md") for n in ("DESIGN", "SECURITY", "STYLE")),
           re.escape("e2b" + "-protocol")]


def repo_text_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
        for name in filenames:
            p = Path(dirpath) / name
            try:
                if p.is_symlink() or p.stat().st_size > 2_000_000:
                    continue
                yield p, p.read_text()
            except (UnicodeDecodeError, OSError):
                continue


def test_nothing_points_outside_the_repository():
    pattern = re.compile("|".join(OUTSIDE))
    bad = [f"{p.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
           for p, text in repo_text_files() for m in pattern.finditer(text)]
    assert not bad, "references to files outside the repository:\n" + "\n".join(bad)


SECTION = r"(\d+(?:\.\d+)*|[a-z](?:\.\d+)*)"


def numbered_sections(doc):
    text = (ROOT / "docs" / doc).read_text()
    return set(re.findall(r"^#+\s+" + SECTION + r"\.?\s", text, re.M))


def headings(doc):
    """Section names: headings, and the bold heads that open a paragraph or
    a list item (architecture.md's "**Streams.**")."""
    text = (ROOT / "docs" / doc).read_text()
    names = re.findall(r"^#+\s+(.*)$", text, re.M) + re.findall(r"^(?:- )?\*\*([^*]+)\*\*", text, re.M)
    return [n.replace("`", "").lower() for n in names]


def test_section_references_exist():
    design, protocol = numbered_sections("design.md"), numbered_sections("protocol.md")
    assert {"1", "3.3", "4", "9"} <= design and {"a.4", "c.5", "e.1"} <= protocol
    text = (ROOT / "docs" / "security.md").read_text()
    promises = set(re.findall(r"^(\d+)\. \*\*", text.split("## Promises", 1)[1].split("\n## ", 1)[0], re.M))
    assert promises == {str(i) for i in range(1, 10)}, promises

    bad = []
    for p, text in repo_text_files():
        rel = p.relative_to(ROOT)

        def where(m):
            return f"{rel}:{text[:m.start()].count(chr(10)) + 1}"
        refs = re.finditer(r"(design|protocol)\.md`?((?:\s*(?:,|/|and)?\s*§" + SECTION + r")+)", text)
        for m in refs:
            for s in re.findall("§" + SECTION, m.group(2)):
                if s not in (design if m.group(1) == "design" else protocol):
                    bad.append(f"{where(m)}: docs/{m.group(1)}.md has no §{s}")
        # inside the two files, a bare § is the file's own (numbers) or the
        # other's (letters: protocol.md's scheme)
        if str(rel) in ("docs/design.md", "docs/protocol.md"):
            for m in re.finditer("§" + SECTION, text):
                s = m.group(1)
                if s not in (design if s[0].isdigit() else protocol):
                    bad.append(f"{where(m)}: no section §{s}")
        for m in re.finditer(r"security\.md`?\s+promises?\s+(\d+)(?:\s*(?:–|-|and|,)\s*(\d+))?", text):
            for n in filter(None, m.groups()):
                if n not in promises:
                    bad.append(f"{where(m)}: docs/security.md has no promise {n}")
        # docs/egress.md ("The proxy"), (`docs/api.md`, "Uploads"), names that
        # may run over a comment's line break
        for m in re.finditer(r"docs/([a-z-]+)\.md`?,?\s*\(?\"([A-Z`][^\"]{0,100})\"", text):
            doc = m.group(1) + ".md"
            name = re.sub(r"\s*\n\s*(?:\*|#|//)?\s*", " ", m.group(2))
            if (ROOT / "docs" / doc).is_file() and not any(
                    h.startswith(name.replace("`", "").lower()) for h in headings(doc)):
                bad.append(f"{where(m)}: docs/{doc} has no section \"{name}\"")
    assert not bad, "\n".join(bad)
