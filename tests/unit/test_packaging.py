"""Packaging: the shipped interaction files (found without $CISOLVER_DATA, byte-identical to the sums their README
lists, declared as package data), the lookup order (explicit path, $CISOLVER_DATA, shipped files), one version."""
import hashlib
import importlib.metadata
import re
import shutil
from pathlib import Path

import pytest

import cisolver
import flapw
import hybridblas
from cisolver.data import ENV, packaged_interactions, resolve_interaction
from cisolver.spectrum import compute_spectrum

ROOT = Path(__file__).resolve().parents[2]
README = packaged_interactions() / "README.md"


def _listed():
    """{file name: sha256} from the table rows of the data README."""
    rows = re.findall(r"^\| `([\w.-]+\.snt)` \|.*\| `([0-9a-f]{64})` \|$", README.read_text(encoding="utf-8"), re.M)
    return dict(rows)


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_readme_lists_every_shipped_file_once():
    listed = _listed()
    assert sorted(listed) == ["ckpot.snt", "gxpf1a.snt", "kb3g.snt", "usdb.snt"]
    assert sorted(p.name for p in packaged_interactions().glob("*.snt")) == sorted(listed)


@pytest.mark.parametrize("name", ["usdb", "ckpot", "gxpf1a", "kb3g"])
def test_shipped_interaction_resolves_without_env_and_matches_readme(name, monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)                         # nothing beside the working folder
    path = resolve_interaction(name)
    assert path == packaged_interactions() / f"{name}.snt"
    assert resolve_interaction(f"{name}.snt") == path
    assert _sha256(path) == _listed()[f"{name}.snt"]


def test_env_folder_overrides_shipped_file_and_falls_back_for_others(monkeypatch, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    # a "usdb" that is really the p-shell interaction: the solver must see this file, not the shipped one
    shutil.copyfile(packaged_interactions() / "ckpot.snt", mine / "usdb.snt")
    monkeypatch.setenv(ENV, str(mine))
    assert resolve_interaction("usdb") == mine / "usdb.snt"
    assert resolve_interaction("gxpf1a") == packaged_interactions() / "gxpf1a.snt"
    out = compute_spectrum("usdb", 4, 4, nev=3)
    assert out["dimension"] == 51                       # 12C in the p shell; 24Mg in the sd shell would be 28503


def test_explicit_path_overrides_env_and_shipped(monkeypatch, tmp_path):
    (tmp_path / "env").mkdir()
    shutil.copyfile(packaged_interactions() / "kb3g.snt", tmp_path / "env" / "usdb.snt")
    own = tmp_path / "own"
    own.mkdir()
    shutil.copyfile(packaged_interactions() / "ckpot.snt", own / "usdb.snt")
    monkeypatch.setenv(ENV, str(tmp_path / "env"))
    assert resolve_interaction(own / "usdb.snt") == own / "usdb.snt"
    assert resolve_interaction(str(own / "usdb.snt")) == own / "usdb.snt"
    monkeypatch.chdir(own)                              # a relative path that exists wins too
    assert resolve_interaction("usdb.snt") == Path("usdb.snt")


def test_bad_env_and_unknown_name_are_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"CISOLVER_DATA must name a folder of \.snt files, got '.*missing'"):
        resolve_interaction("usdb")
    monkeypatch.delenv(ENV)
    with pytest.raises(FileNotFoundError, match=r"interaction 'usdb2' not found .*shipped: ckpot, gxpf1a, kb3g, usdb"):
        resolve_interaction("usdb2")


def test_pyproject_declares_the_data_files_and_one_version():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["dynamic"] == ["version"] and "version" not in meta["project"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hybridblas._version.__version__"}
    declared = {p.relative_to(ROOT / "cisolver").as_posix()
                for pattern in meta["tool"]["setuptools"]["package-data"]["cisolver"]
                for p in (ROOT / "cisolver").glob(pattern)}
    assert declared == {f"data/interactions/{n}" for n in [*_listed(), "README.md"]}
    assert meta["project"]["license"] == "BSD-3-Clause" and "LICENSE" in meta["project"]["license-files"]


def test_one_version_string_everywhere():
    from hybridblas._version import __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert hybridblas.__version__ == flapw.__version__ == cisolver.__version__ == __version__


def test_installed_distribution_carries_data_and_version():
    # pip's record of what it installed (RECORD); an egg-info folder a build leaves in the tree has none
    installed = [d for d in importlib.metadata.distributions(name="hybridblas") if d.read_text("RECORD")]
    if not installed:
        pytest.skip("hybridblas is not installed (pip install . records its files in site-packages)")
    for dist in installed:
        assert dist.version == hybridblas.__version__
        files = {f.as_posix(): f for f in dist.files}
        for name, digest in _listed().items():
            assert _sha256(files[f"cisolver/data/interactions/{name}"].locate()) == digest
        assert "cisolver/data/interactions/README.md" in files
        assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files)
