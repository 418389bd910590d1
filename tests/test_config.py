"""Configuration: precedence, validation messages, and generated docs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from notebookos.config import ConfigError, load_config, render_markdown, settings

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_valid_and_documented() -> None:
    config = load_config(env={})
    assert config.cluster.replicas_per_kernel == 3
    assert config.cluster.policy == "notebookos"
    assert config.store_url.startswith("file://")
    assert len(settings()) >= 25


def test_precedence_default_file_env_flag(tmp_path: Path) -> None:
    toml = tmp_path / "nbos.toml"
    toml.write_text('[local_scheduler]\nvirtual_gpus = 2\nprewarm_pool_size = 5\n'
                    '[kernel]\nelection_timeout_s = 0.25\n')
    env = {"NOTEBOOKOS_LOCAL_SCHEDULER_VIRTUAL_GPUS": "6"}
    config = load_config(toml, env=env, overrides={"local_scheduler.prewarm_pool_size": 7,
                                                   "jupyter.port": None})
    assert config.local_scheduler.virtual_gpus == 6  # env beats file
    assert config.local_scheduler.prewarm_pool_size == 7  # flag beats file
    assert config.kernel.election_timeout_s == 0.25  # file beats default
    assert config.jupyter.port == 8888  # an unset flag falls through
    env["NOTEBOOKOS_CONFIG"] = str(toml)
    assert load_config(env=env).kernel.election_timeout_s == 0.25


@pytest.mark.parametrize(
    "env, message",
    [
        ({"NOTEBOOKOS_JUPYTER_PORT": "70000"}, "jupyter.port = '70000'"),
        ({"NOTEBOOKOS_JUPYTER_OPEN_BROWSER": "maybe"}, "expected true or false"),
        ({"NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "nan"}, "finite"),
        ({"NOTEBOOKOS_CLUSTER_STORE": "ftp://x"}, "s3://bucket"),
        ({"NOTEBOOKOS_LOCAL_SCHEDULER_VIRTUAL_GPUS": "-1"}, "a number >= 0"),
        ({"NOTEBOOKOS_CLUSTER_REPLICAS": "3"}, "unknown environment setting"),
        ({"NOTEBOOKOS_GLOBAL_SCHEDULER_MIN_HOSTS": "9",
          "NOTEBOOKOS_GLOBAL_SCHEDULER_MAX_HOSTS": "4"}, "max_hosts"),
    ],
)
def test_invalid_values_name_setting_value_and_rule(env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match="not allowed|unknown") as err:
        load_config(env=env)
    assert message in str(err.value)


def test_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    bad.write_text("[cluster]\npolicyy = 'x'\n")
    with pytest.raises(ConfigError, match="unknown setting 'cluster.policyy'"):
        load_config(bad, env={})
    bad.write_text("[cluster]\nreplicas_per_kernel = 'three'\n")
    with pytest.raises(ConfigError, match=f"replicas_per_kernel = 'three' \\(from {bad}\\)"):
        load_config(bad, env={})


def test_unknown_flag_setting_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(env={}, overrides={"cluster.nope": 1})


def test_docs_are_generated_from_the_declarations() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == render_markdown(), "run: notebookos config docs > docs/configuration.md"
    for info in settings():
        assert f"`{info.name}`" in committed and info.env_var in committed


def test_cli_config_check_reports_bad_value_and_exits_2() -> None:
    cmd = [sys.executable, "-m", "notebookos.cli", "config", "check"]
    ok = subprocess.run(cmd, capture_output=True, text=True, env={"PATH": ""}, timeout=60)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                         env={"NOTEBOOKOS_KERNEL_SYNC_THRESHOLD_BYTES": "big"})
    assert bad.returncode == 2
    assert "kernel.sync_threshold_bytes = 'big'" in bad.stderr and "Traceback" not in bad.stderr
