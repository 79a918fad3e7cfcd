"""Every path and module the manual names exists: a file moved or renamed fails here, naming
the page and the stale name, so the docs follow the code."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.markdown import DOCS, ROOT, named_paths, pages, resolves


def test_every_path_and_module_the_docs_name_exists():
    stale = sorted(
        f"{page}: `{name}`"
        for page, text in pages().items()
        for name in named_paths(text)
        if not resolves(name)
    )
    assert not stale, "names in the docs that are not in the tree:\n" + "\n".join(stale)


def test_the_check_sees_the_names_it_is_meant_to():
    text = "Rules in `agents/packs/red_flags.py`, the `learner/gate/` package, `deploy.cli`, and\n"
    text += "`agents.runtime.AgentSpec`; not `/v1/feedback`, `module:attr` or `.arloop/demo-<t>/`."
    assert named_paths(text) == {
        "agents/packs/red_flags.py",
        "learner/gate/",
        "deploy.cli",
        "agents.runtime.AgentSpec",
    }
    assert resolves("learner/gate/") and resolves("agents.runtime.AgentSpec")
    assert not resolves("deploy/policy_server/rows.py") and not resolves("agents.no_such_module")


def test_every_module_the_layout_page_lists_is_in_its_package():
    """The layout table's rows: `| `pkg/` | ... `module` ... |`, each backticked name a file or
    folder of that package (`rows` and `prefix_cache` were once listed under the policy server
    after they had moved to the learner's generation engine)."""
    missing = []
    for line in (DOCS / "layout.md").read_text().splitlines():
        row = re.match(r"\| `([\w/]+)/` \| (.*) \|$", line)
        if not row or row.group(1) in ("deploy/manifests", "bench", "tests"):
            continue  # not Python packages: their rows name files by their own names
        package, text = row.groups()
        names = re.findall(r"`([a-z_]\w*)/?`", text)
        missing += [f"{package}/{n}" for n in names if n != "arloop" and not _in(Path(package), n)]
    assert not missing, f"the layout page lists modules that are not there: {missing}"


def _in(package: Path, name: str) -> bool:
    folder = ROOT / package
    return (folder / f"{name}.py").exists() or (folder / name).is_dir()


def test_the_readme_links_to_pages_that_exist():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert links, "the README links to no page"
    assert [link for link in links if not (ROOT / link).exists()] == []
