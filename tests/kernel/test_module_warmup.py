"""The executor's library imports reach the standbys (kernel/module_warmup.py, issue 36).

A library often imports most of itself lazily, at first use (torch's first optimizer step imports
``torch._dynamo`` and sympy: seconds). The standbys must have done those imports before one of
them takes over, or the first cell after a failover pays for them while the user waits.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness import ReplicaGroup

from notebookos.kernel.sync_codec import SyncUpdate


def test_library_imports_lists_new_stdlib_and_site_packages_modules_but_not_the_users(
    tmp_path: Path,
) -> None:
    (tmp_path / "users_own_module.py").write_text("VALUE = 1\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from notebookos.kernel.module_warmup import LibraryImports
        imports = LibraryImports()
        assert imports.new() == []
        import colorsys, users_own_module, yaml
        new = imports.new()
        print(sorted(n for n in new if n in ("colorsys", "users_own_module", "yaml")))
        print(imports.new())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out == ["['colorsys', 'yaml']", "[]"], out


def test_packages_of_a_venv_layered_on_another_venvs_site_packages_count_as_libraries(
    tmp_path: Path,
) -> None:
    # A virtual environment whose packages come from another one's site-packages through a
    # .pth file (how this project's worktrees are set up): torch found that way is a library,
    # and torch._dynamo, imported lazily at the first optimizer step, must travel to the
    # standbys (before, it did not: the first cell after a failover imported it, 3 s).
    import yaml

    outer_site = Path(yaml.__file__).resolve().parent.parent
    layered = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(layered)], check=True,
                   timeout=120)
    python = layered / "bin" / "python"
    site_dir = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(site_dir, "outer-site.pth").write_text(f"# the outer venv\n{outer_site}\n")
    warmup = Path(__file__).resolve().parents[2] / "kernel" / "module_warmup.py"
    # the core (notebookos/library_paths.py: the library folders) from the source tree; the
    # layered venv has the outer venv's packages only, not its editable install of this project
    script = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {str(warmup.parents[1])!r})
        spec = importlib.util.spec_from_file_location("module_warmup", {str(warmup)!r})
        module_warmup = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module_warmup)
        imports = module_warmup.LibraryImports()
        import yaml
        print("yaml" in imports.new())
    """)
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                         timeout=60, check=True, cwd=tmp_path).stdout
    assert out == "True\n", out


def test_pth_folders_reads_paths_and_skips_comments_and_imports(tmp_path: Path) -> None:
    from notebookos.kernel.module_warmup import pth_folders

    (tmp_path / "a.pth").write_text("# a comment\nimport os\n../elsewhere\n\n/abs/dir\n")
    (tmp_path / "not-a-pth.txt").write_text("/ignored\n")
    assert pth_folders(str(tmp_path)) == [str(tmp_path / "../elsewhere"), "/abs/dir"]
    assert pth_folders(str(tmp_path / "missing")) == []


def test_a_sync_update_carries_module_names_and_older_records_still_decode() -> None:
    update = SyncUpdate([], [], ["colorsys", "torch._dynamo"])
    assert SyncUpdate.from_bytes(update.to_bytes()).modules == ["colorsys", "torch._dynamo"]
    assert SyncUpdate.from_bytes(SyncUpdate([], ["w"]).to_bytes()).modules == []


def test_a_malformed_module_list_is_refused_not_imported() -> None:
    import pickle

    from notebookos.kernel.sync_codec import UPDATE_MAGIC

    bad = UPDATE_MAGIC + pickle.dumps({"v": 1, "e": [], "w": [], "m": [b"os"]}, protocol=5)
    with pytest.raises(ValueError, match="modules must be a list of strings"):
        SyncUpdate.from_bytes(bad)


def _has_modules(group: ReplicaGroup, replica_id: int, names: tuple[str, ...]) -> str:
    probe = f"import sys\nprint([n in sys.modules for n in {names!r}])"
    return group.execute(probe, target=replica_id).stdout()


def test_a_standby_takes_over_with_the_executors_lazy_imports_done(group: ReplicaGroup) -> None:
    # the names are imported inside a function: nothing in the namespace refers to them
    names = ("colorsys", "wave", "tomllib")
    first = group.execute("def train():\n    import colorsys, wave, tomllib\n    return 1\n"
                          "step = train()", target=1)
    assert first.executor() == 1, first.summary()
    time.sleep(0.5)  # the standbys import in the background, after applying the update
    group.kill(1)
    assert _has_modules(group, 2, names) == "[True, True, True]\n"


def test_a_replacement_replica_imports_what_the_executor_had_imported(group: ReplicaGroup) -> None:
    group.execute("def train():\n    import colorsys\n    return 1\nstep = train()", target=1)
    group.kill(3)
    assert group.remove(3, via=1)["content"]["status"] == "ok"
    replacement = group.add_replacement(via=1)
    time.sleep(0.5)
    assert _has_modules(group, replacement.replica_id, ("colorsys",)) == "[True]\n"


def test_checkpoints_keep_the_module_list_across_full_parts_and_segments(file_store) -> None:
    from notebookos.kernel.checkpoint_log import CheckpointLog
    from notebookos.kernel.sync_codec import SyncState, read_checkpoint

    state = SyncState()
    log = CheckpointLog(file_store, "k1")
    state.modules.update(dict.fromkeys(["colorsys"]))
    state.modules_dirty.append("colorsys")
    log.write(state, 1)  # the full part
    state.modules.update(dict.fromkeys(["wave"]))
    state.modules_dirty.append("wave")
    log.write(state, 2)  # a segment
    assert log.full_writes == 1 and log.segment_writes == 1
    assert read_checkpoint(file_store, "k1").modules == ["colorsys", "wave"]
