"""The documentation site as a reader meets it (mkdocs.yml, docs/): it builds with MkDocs in strict mode (a broken
link or anchor, a page missing from the nav, a nav entry without its page all fail); README's links resolve;
every Python block of the landing page and the guide runs, and every `torchboost ...` line of their shell
blocks (and the README's) parses with the CLI's own parser. tests/test_readme.py does the same for the README itself.

Pages are found, not listed: a page added under docs/guide/ is checked without touching this file.

Marking a guide block (an HTML comment right before the fence; the site and GitHub do not show it):

    <!-- not run: needs ImageNet; covered by tests/test_recipe_data.py::test_name -->
        the block is compiled but not run; the named test (file and function) must exist, so every
        block left out names the test that covers what it shows.
    <!-- shorten: `epochs=12` -> `epochs=1` -->
        the block runs with the first text replaced by the second (the first must be in it), as
        tests/test_readme.py runs the README's 12-epoch example for 3; several pairs may follow `shorten:`.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from bounded import within
from torchboost.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
BUILD_SECONDS = 120  # the build takes about a second; the bound is against a hang, not a budget
BLOCK_SECONDS = 120  # one code block of a page: blocks are kept tiny (a few updates on random tensors)
SHELL = {"bash", "sh", "shell", "console"}
NOT_PYTHON_FENCE = {"py", "python3", "py3"}  # would escape the run: write ```python


def pages() -> list[Path]:
    """The pages whose code blocks are checked: the landing page and every guide page."""
    return [p for p in [DOCS / "index.md", *sorted((DOCS / "guide").glob("*.md"))] if p.is_file()]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


# --- reading a page --------------------------------------------------------------------------------------------

@dataclass
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    notes: list[str] = field(default_factory=list)  # the HTML comments right before the fence

    def not_run(self) -> str | None:
        return next((n for n in self.notes if n.startswith("not run")), None)

    def shortenings(self) -> list[tuple[str, str]]:
        return [pair for n in self.notes if n.startswith("shorten:")
                for pair in re.findall(r"`([^`]+)`\s*->\s*`([^`]*)`", n)]


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`{]*)")


def fenced_blocks(text: str) -> list[Block]:
    """Fenced code blocks (also indented ones, in lists and admonitions), each with the HTML comments that
    stand right before its fence (blank lines between them allowed)."""
    lines, out, i = text.splitlines(), [], 0
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m["fence"]
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        code = textwrap.dedent("\n".join(lines[i + 1:j])) + "\n"
        before, notes = text[:offsets[i]].rstrip(), []
        while (c := re.search(r"<!--((?:(?!-->).)*)-->\s*\Z", before, flags=re.S)):
            notes.insert(0, " ".join(c[1].split()))
            before = before[:c.start()].rstrip()
        out.append(Block(m["lang"].lower(), code, i + 1, notes))
        i = j + 1
    return out


def covering_test(note: str) -> tuple[Path, list[str]]:
    """`not run: WHY; covered by tests/FILE.py::[Class::]test_name` -> (the file, the names in it)."""
    m = re.search(r"covered by\s+(tests/[\w/.-]+\.py)::([\w:]+)", note)
    assert m, (f"'{note}' does not name the test that covers the block: write "
               f"<!-- not run: WHY; covered by tests/test_file.py::test_name -->")
    return ROOT / m[1], m[2].split("::")


def defines(path: Path, names: list[str]) -> bool:
    """Whether the test file defines the test (a function, or a method of a class)."""
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for n in names:
        node = next((s for s in scope if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and s.name == n), None)
        if node is None:
            return False
        scope = getattr(node, "body", [])
    return names[-1].startswith("test")


# --- the site --------------------------------------------------------------------------------------------------

def test_the_site_builds_in_strict_mode(tmp_path):
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]'; `make test` installs it via .[all])")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=BUILD_SECONDS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs" and config.get("strict") is True

    def files(nav) -> list[str]:
        items = nav if isinstance(nav, list) else list(nav.values()) if isinstance(nav, dict) else [nav]
        return [f for item in items for f in (files(item) if not isinstance(item, str) else [item])]

    listed = files(config["nav"])
    assert "index.md" in listed and any(f.startswith("guide/") for f in listed)
    for page in listed:  # each page of the nav became a page of the site
        html = site / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert html.is_file(), page


# --- the README's links ----------------------------------------------------------------------------------------

def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings (lower case, punctuation dropped, spaces to hyphens,
    repeats numbered), plus explicit <a id/name> anchors."""
    text = re.sub(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", "", markdown, flags=re.S | re.M)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, flags=re.M):
        heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
        heading = re.sub(r"<[^>]+>", "", heading).lower()
        slug = "".join(c for c in heading if c in " -_" or unicodedata.category(c)[0] in "LNM").replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors | set(re.findall(r"<a\s[^>]*(?:id|name)=[\"']([^\"']+)", markdown))


def readme_links() -> list[str]:
    """Relative links of README.md outside code: inline, images, reference definitions, HTML href/src; and
    every docs/ path it names in prose or code spans (a page a reader is sent to)."""
    text = re.sub(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", "", README.read_text(), flags=re.S | re.M)
    links = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    links += re.findall(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", text, flags=re.M)
    links += re.findall(r"(?:href|src)=[\"']([^\"']+)", text)
    links += re.findall(r"(?<![\w/.:#-])((?:\./)?docs/[\w./-]*[\w/])", text)
    return [link for link in dict.fromkeys(links) if not re.match(r"[a-z][a-z0-9+.-]*:", link, flags=re.I)]


def test_every_readme_link_into_docs_resolves():
    links = readme_links()
    assert any(link.lstrip("./").startswith("docs/") for link in links), "README links into docs/ not found"
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = (README.parent / path).resolve() if path else README
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in github_anchors(target.read_text()):
            broken.append(f"{link}: {target.name} has no heading with the anchor #{anchor}")
    assert not broken, "README.md links to what is not there:\n" + "\n".join(broken)


# --- the pages' code blocks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", pages(), ids=name)
def test_blocks_left_out_name_a_real_test(page):
    """Each `not run` block names the test that covers it, and that test exists; the block still compiles;
    a `shorten` names text the block holds; Python is fenced as ```python (```py would escape the run)."""
    for block in fenced_blocks(page.read_text()):
        where = f"{name(page)}:{block.line}"
        assert block.lang not in NOT_PYTHON_FENCE, f"{where}: fence Python as ```python, not ```{block.lang}"
        if block.lang != "python":
            assert not block.not_run() and not block.shortenings(), f"{where}: a marker before a {block.lang} block"
            continue
        compile(block.code, where, "exec")
        if (note := block.not_run()) is not None:
            path, names = covering_test(note)
            assert path.is_file(), f"{where}: '{note}' names {path.relative_to(ROOT)}, which does not exist"
            assert defines(path, names), f"{where}: '{note}': {'::'.join(names)} is not a test in {path.name}"
        for old, _ in block.shortenings():
            assert old in block.code, f"{where}: shorten `{old}`, but the block does not hold it"


@pytest.mark.parametrize("page", pages(), ids=name)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    """A page's Python blocks in order, in one namespace (later blocks build on earlier ones), in a fresh
    folder, as a script (__name__ == "__main__"); blocks marked `not run` are left out."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    scope: dict = {"__name__": "__main__"}
    for block in fenced_blocks(page.read_text()):
        if block.lang != "python" or block.not_run():
            continue
        code = block.code
        for old, new in block.shortenings():
            code = code.replace(old, new)
        where = f"{name(page)}:{block.line}"
        # padded so a traceback names the page's own line numbers
        with within(BLOCK_SECONDS, f"the Python block at {where}"):
            exec(compile("\n" * block.line + code, str(page), "exec"), scope)


# --- the pages' shell blocks -----------------------------------------------------------------------------------

OPERATOR = re.compile(r"[();<>|&]+")
PREFIX = {"do", "then", "else", "time", "nohup", "exec", "sudo", "env", "!"}


def torchboost_argvs(script: str) -> list[list[str]]:
    """The arguments of each `torchboost ...` command of a shell block: at the start of a command (after
    VAR=value, `sudo` and the like) or after `-m` (python -m, torchrun -m); continuations joined, comments,
    prompts, pipes, redirections and `&&`/`;` chains cut away."""
    argvs = []
    for line in script.replace("\\\n", " ").splitlines():
        line = re.sub(r"^\s*\$ ", "", line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:  # an unclosed quote: no command this check can read
            continue
        segment: list[str] = []
        for token in [*tokens, ";"]:
            if not OPERATOR.fullmatch(token):
                segment.append(token)
                continue
            if token.startswith((">", "<")) and segment and segment[-1].isdigit():
                segment.pop()  # 2>&1, 2> file: the descriptor is the redirection's, not an argument
            while segment and (segment[0] in PREFIX or re.fullmatch(r"[A-Za-z_]\w*=.*", segment[0])):
                segment.pop(0)
            if segment and (segment[0] == "torchboost" or segment[0].endswith("/torchboost")):
                argvs.append(segment[1:])
            elif "-m" in segment[:-1] and segment[segment.index("-m") + 1] == "torchboost":
                argvs.append(segment[segment.index("-m") + 2:])
            segment = [] if not token.startswith((">", "<")) else ["<redirected>"]
    return argvs


def parse_error(argv: list[str]) -> str | None:
    """None if the CLI's own parser accepts argv (a real subcommand, real options, valid choices), else its
    one-line error."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help and --version exit 0
        return None if not e.code else err.getvalue().strip() or f"exit {e.code}"
    if args.command == "launch":  # what launch runs on every process is a train command line
        if args.train[:1] != ["train"]:
            return "torchboost launch must end with `train ...`"
        return parse_error(args.train)
    return None


def test_the_command_check_reads_shell_lines():
    script = textwrap.dedent("""\
        $ torchboost train --epochs 2 \\
            --set "boost.config={grad_freeze: {param_groups: 2}}"   # a comment
        OMP_NUM_THREADS=1 torchboost race -c digits-lenet --optimizers sgd muon 2>&1 | tee race.log
        torchrun --nproc_per_node=2 -m torchboost train && .venv/bin/torchboost --version > v.txt
        pip install torchboost; python benchmarks/overhead.py
        """)
    assert torchboost_argvs(script) == [
        ["train", "--epochs", "2", "--set", "boost.config={grad_freeze: {param_groups: 2}}"],
        ["race", "-c", "digits-lenet", "--optimizers", "sgd", "muon"], ["train"], ["--version"]]
    assert [parse_error(a) for a in torchboost_argvs(script)] == [None] * 4
    assert "invalid choice" in parse_error(["trian"])
    assert "unrecognized arguments: --epoks" in parse_error(["train", "--epoks", "2"])
    assert parse_error(["launch", "--nproc-per-node", "2", "train", "--lr", "x"])  # the train part is parsed
    # the markers, read from a page
    page = textwrap.dedent("""\
        <!-- not run: needs ImageNet;
             covered by tests/test_docs_site.py::test_the_command_check_reads_shell_lines -->

        ```python
        x = 1
        ```
        - a list item:

            <!-- shorten: `epochs=12` -> `epochs=1` -->
            ```python
            train(epochs=12)
            ```
        """)
    first, second = fenced_blocks(page)
    assert first.not_run() and defines(*covering_test(first.not_run())) and first.code == "x = 1\n"
    assert second.line == 10 and second.shortenings() == [("epochs=12", "epochs=1")] and not second.not_run()
    assert not defines(Path(__file__), ["test_no_such_test"])


@pytest.mark.parametrize("page", [README, *pages()], ids=name)
def test_shell_commands_are_real(page):
    """Shell blocks are not run (the CLI tests run the commands); each `torchboost ...` line in them must parse:
    a real subcommand, real options, allowed choices. The README's too: tests/test_first_hour.py checks the
    subcommand names it uses, this the whole line."""
    wrong = [f"{name(page)}:{block.line}: torchboost {shlex.join(argv)}\n    {error}"
             for block in fenced_blocks(page.read_text()) if block.lang in SHELL
             for argv in torchboost_argvs(block.code) if (error := parse_error(argv))]
    assert not wrong, "commands the CLI refuses:\n" + "\n".join(wrong)
