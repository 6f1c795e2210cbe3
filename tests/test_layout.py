"""Each file in its room: every installable package declares what its modules import, and no code
edits sys.path (a module is found because it is installed, or because pytest or the make target
put its directory there)."""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def ours(path):
    """A file of the project's own, not of a build, a virtual environment or a state directory."""
    return not any(
        part.startswith(".") or part == "node_modules" for part in path.relative_to(ROOT).parts
    )


PROJECTS = sorted(p.parent for p in ROOT.glob("*/**/pyproject.toml") if ours(p))


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def project(directory):
    data = tomllib.loads((directory / "pyproject.toml").read_text())
    setuptools = data["tool"]["setuptools"]
    modules = [directory / p.replace(".", "/") for p in setuptools.get("packages", [])]
    modules += [directory / f"{m}.py" for m in setuptools.get("py-modules", [])]
    meta = data["project"]
    requires = meta.get("dependencies", []) + [
        d for extra in meta.get("optional-dependencies", {}).values() for d in extra
    ]
    declared = {canonical(re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0]) for d in requires}
    return canonical(meta["name"]), modules, declared


def own_modules():
    """{top-level module: project name} of the projects in this tree."""
    out = {}
    for directory in PROJECTS:
        name, modules, _ = project(directory)
        for m in modules:
            out[m.name.removesuffix(".py")] = name
    return out


def imported(paths):
    """Top-level names of every absolute import in the files."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_the_projects_are_found():
    names = {project(d)[0] for d in PROJECTS}
    assert {
        "blockstack-exporter",
        "blockstack-deploy",
        "blockstack-lab",
        "blockstack-rules",
        "blockstack-dashboard",
        "blockstack-page-receiver",
    } <= names


@pytest.mark.parametrize("directory", PROJECTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_a_package_declares_what_it_imports(directory):
    name, modules, declared = project(directory)
    files = [f for m in modules for f in ([m] if m.suffix == ".py" else sorted(m.rglob("*.py")))]
    assert files, f"{name}: no modules found"
    own = own_modules()
    third_party = importlib.metadata.packages_distributions()
    missing = []
    for module in sorted(imported(files) - set(sys.stdlib_module_names)):
        if own.get(module) == name:
            continue
        provider = own.get(module) or next(iter(third_party.get(module, [])), None)
        if provider is None or canonical(provider) not in declared:
            missing.append(f"{module} ({provider or 'not installed'})")
    assert not missing, (
        f"{directory.relative_to(ROOT)}/pyproject.toml does not declare: {', '.join(missing)}"
    )


def test_no_code_edits_sys_path():
    edits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in ROOT.rglob("*.py")
        if ours(p)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bsys\.path\.(insert|append|extend)\(|\bsys\.path\s*[+]?=", line)
    ]
    assert not edits, edits


def test_venv_installs_third_party_packages_only_by_hash():
    """requirements.txt (make lock) pins every third-party dependency of every package here, at the
    version its pyproject.toml pins, each with sha256 hashes; `make venv` installs it with
    --require-hashes and the project's own packages with --no-deps (nothing resolved unhashed)."""
    locked, name = {}, None
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            name, version = line.split(" ")[0].split("==")
            locked[canonical(name)] = (version, [])
        elif "--hash=sha256:" in line:
            locked[canonical(name)][1].append(line.split("sha256:")[1].split()[0])
    assert locked and all(
        len(h) >= 1 and all(len(x) == 64 for x in h) for _, h in locked.values()
    ), locked
    ours_names = {project(d)[0] for d in PROJECTS}
    for directory in PROJECTS:
        meta = tomllib.loads((directory / "pyproject.toml").read_text())["project"]
        for req in meta.get("dependencies", []) + [
            r for e in meta.get("optional-dependencies", {}).values() for r in e
        ]:
            dep = canonical(re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0])
            if dep in ours_names:
                continue
            assert dep in locked, (
                f"{directory.name}: {dep} is not in requirements.txt (add it to requirements.in, make lock)"
            )
            pinned = re.search(r"==\s*([^\s;,]+)", req)
            assert not pinned or pinned.group(1) == locked[dep][0], (
                directory.name,
                req,
                locked[dep][0],
            )
    venv = re.search(
        r"^\$\(VENV\)/\.stamp:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.S | re.M
    ).group(0)
    installs = [line for line in venv.splitlines() if "pip install" in line]
    assert len(installs) == 2 and "--require-hashes -r requirements.txt" in installs[0].replace(
        "--only-binary=:all: ", ""
    ), installs
    assert "--no-deps" in installs[1] and "-r " not in installs[1], installs
