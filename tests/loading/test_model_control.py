"""Model control modes on a real `kernel serve`: none, explicit (--load-model) and poll.

Poll mode must notice added, changed and removed models and versions, reload
only what changed, and keep answering the requests of clients meanwhile.
"""

from __future__ import annotations

import shutil
import threading

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TEST_MODELS, KernelProcess
from control_helpers import index, make_repo, scale_of, scaler_inputs, set_scale, states, wait_for


def _start(start_kernel, repo, *flags):
    return start_kernel([repo], *flags).wait_ready()


# ---- start-up flags ----------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--load-model", "scaler"], "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
        (["--model-control-mode=poll", "--load-model", "scaler"], "requires setting '--model-control-mode=explicit'"),
        (["--model-control-mode=explicit", "--load-model=*", "--load-model", "scaler"],
         "Wildcard model name '*' must be the ONLY startup model if specified at all."),
        (["--model-control-mode=explicit", "--load-model", "nope"], "failed to load all models"),
        (["--model-control-mode=explicit", "--load-model", "../scaler"], "failed to load all models"),
        (["--model-config-name="], "empty argument for --model-config-name"),
        (["--model-control-mode=sometimes"], "invalid choice"),
    ],
)
def test_bad_start_up_flags_stop_the_server(tmp_path, flags, message):
    repo = make_repo(tmp_path / "repo", "scaler")
    k = KernelProcess([repo], *flags)
    try:
        assert k.wait_exit(60) != 0
        assert message in k.log()
    finally:
        k.stop()


def test_missing_startup_model_with_exit_on_error_false(tmp_path, start_kernel):
    repo = make_repo(tmp_path / "repo", "scaler", "other=scaler")
    k = _start(start_kernel, repo, "--model-control-mode=EXPLICIT", "--load-model", "nope", "--load-model", "scaler",
               "--exit-on-error=false")
    assert "failed to poll model 'nope': model not found in any model repository." in k.log()
    client = httpclient.InferenceServerClient(k.url)
    assert client.is_server_ready()  # nothing failed to load: 'nope' was never there
    assert client.is_model_ready("scaler") and not client.is_model_ready("other")
    client.close()


# ---- explicit mode -----------------------------------------------------------------


def test_explicit_mode_loads_only_what_is_asked(tmp_path, start_kernel):
    repo = make_repo(tmp_path / "repo", "scaler", "other=scaler", "ens_pipeline", "ens_addsub", "ens_mul")
    k = _start(start_kernel, repo, "--model-control-mode=explicit")
    s = states(k.url)
    assert all(state == ("", "") for state in s.values()), s  # nothing loaded: names only
    client = httpclient.InferenceServerClient(k.url)
    assert client.is_server_ready()
    with pytest.raises(InferenceServerException, match="is not found"):
        client.get_model_metadata("scaler")

    # A model that fails to load: Triton's error, and (strict readiness) an unready server until it is unloaded.
    shutil.copytree(TEST_MODELS / "bad" / "init_fails", repo / "init_fails")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("init_fails")
    assert err.value.status() == "400"
    assert err.value.message().startswith("load failed for model 'init_fails': version 1 is at UNAVAILABLE state: "
                                          "Internal: RuntimeError: initialize refused to start\n\nAt:\n  ")  # Triton's framing
    state, reason = states(k.url)[("init_fails", "1")]
    assert state == "UNAVAILABLE" and reason in err.value.message()
    assert not client.is_server_ready()
    client.unload_model("init_fails")
    assert client.is_server_ready()
    assert states(k.url)[("init_fails", "1")] == ("UNAVAILABLE", "unloaded")
    # A model.py that does not compile: its SyntaxError alone, no importlib frames (as tritonserver 2.51)
    shutil.copytree(TEST_MODELS / "bad" / "syntax_error", repo / "syntax_error")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("syntax_error")
    message = err.value.message()
    assert message.startswith("load failed for model 'syntax_error': version 1 is at UNAVAILABLE state: "
                              "Internal: SyntaxError: "), message
    assert message.endswith("(model.py, line 2);\n") and "At:" not in message, message
    # auto_complete_config raising: tritonserver reports it as the version's failure
    (repo / "autocomplete_fails" / "1").mkdir(parents=True)
    (repo / "autocomplete_fails" / "config.pbtxt").write_text('backend: "python"\n')
    (repo / "autocomplete_fails" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n"
        "        raise ValueError('auto-complete refused')\n\n    def execute(self, requests):\n        return []\n")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("autocomplete_fails")
    message = err.value.message()
    assert message.startswith("load failed for model 'autocomplete_fails': version 1 is at UNAVAILABLE state: "
                              "Internal: ValueError: auto-complete refused\n\nAt:\n  "), message
    assert message.endswith("(4): auto_complete_config\n;\n"), message
    state, reason = states(k.url)[("autocomplete_fails", "1")]
    assert state == "UNAVAILABLE" and reason.startswith("Internal: ValueError: auto-complete refused\n")
    client.close()


def test_load_everything_with_wildcard_and_custom_config_name(tmp_path, start_kernel):
    repo = make_repo(tmp_path / "repo", "scaler", "other=scaler", "ens_pipeline", "ens_addsub", "ens_mul")
    alt = repo / "scaler" / "configs"
    alt.mkdir()
    shutil.copy(repo / "scaler" / "config.pbtxt", alt / "alt.pbtxt")
    text = (alt / "alt.pbtxt").read_text().replace('string_value: "2"', 'string_value: "7"')
    (alt / "alt.pbtxt").write_text(text)
    k = _start(start_kernel, repo, "--model-control-mode=explicit", "--load-model=*", "--model-config-name", "alt")
    s = states(k.url)
    assert {name for (name, _), (state, _) in s.items() if state == "READY"} == {
        "scaler", "other", "ens_pipeline", "ens_addsub", "ens_mul"}
    client = httpclient.InferenceServerClient(k.url)
    assert scale_of(client, httpclient)[0] == 7.0  # configs/alt.pbtxt
    assert scale_of(client, httpclient, "other")[0] == 2.0  # no configs/alt.pbtxt: config.pbtxt
    client.close()


def test_startup_ensemble_brings_its_steps(tmp_path, start_kernel):
    repo = make_repo(tmp_path / "repo", "scaler", "ens_pipeline", "ens_addsub", "ens_mul")
    k = _start(start_kernel, repo, "--model-control-mode=explicit", "--load-model", "ens_pipeline")
    s = states(k.url)
    assert s[("ens_pipeline", "1")][0] == s[("ens_addsub", "1")][0] == s[("ens_mul", "1")][0] == "READY"
    assert s[("scaler", "")] == ("", "")


def test_several_repositories(tmp_path, start_kernel):
    first = make_repo(tmp_path / "first", "scaler", "twin=scaler")
    second = make_repo(tmp_path / "second", "other=scaler", "twin=scaler")
    k = start_kernel([first, second], "--model-control-mode=explicit").wait_ready()
    rows = {r["name"]: r for r in index(k.url)}
    assert sorted(rows) == ["other", "scaler", "twin"]
    duplicate = {"name": "twin", "state": "UNAVAILABLE", "reason": "model appears in two or more repositories"}
    assert rows["twin"] == duplicate
    client = httpclient.InferenceServerClient(k.url)
    with pytest.raises(InferenceServerException) as err:
        client.load_model("twin")
    assert "not unique across all model repositories" in err.value.message()
    client.load_model("other")  # found in the second repository
    assert scale_of(client, httpclient, "other")[0] == 2.0
    client.close()


# ---- none mode ---------------------------------------------------------------------


def test_none_mode_refuses_load_and_unload(tmp_path, start_kernel):
    repo = make_repo(tmp_path / "repo", "scaler")
    k = _start(start_kernel, repo)
    hc = httpclient.InferenceServerClient(k.url)
    gc = grpcclient.InferenceServerClient(k.grpc_url)
    for call in (hc.load_model, hc.unload_model):
        with pytest.raises(InferenceServerException) as err:
            call("scaler")
        assert err.value.status() == "503"
        assert err.value.message() == "explicit model load / unload is not allowed if polling is enabled"
    for call in (gc.load_model, gc.unload_model):
        with pytest.raises(InferenceServerException) as err:
            call("scaler")
        assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert states(k.url)[("scaler", "1")] == ("READY", "")
    assert scale_of(hc, httpclient)[0] == 2.0  # untouched
    hc.close()
    gc.close()


# ---- poll mode -----------------------------------------------------------------------


class _Inferrer(threading.Thread):
    def __init__(self, url: str, model: str):
        super().__init__(daemon=True)
        self.client = httpclient.InferenceServerClient(url)
        self.model = model
        self.answers: list[tuple[float, int]] = []
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        x, inputs = scaler_inputs(httpclient)
        while not self.halt.is_set():
            try:
                result = self.client.infer(self.model, inputs)
                self.answers.append((float(result.as_numpy("OUTPUT0")[0] / x[0]), int(result.as_numpy("VERSION")[0])))
            except Exception as exc:  # noqa: BLE001 - asserted empty
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        self.client.close()


def test_poll_mode_follows_the_repository(tmp_path, start_kernel):
    repo = make_repo(tmp_path / "repo", "scaler", "other=scaler")
    k = _start(start_kernel, repo, "--model-control-mode=poll", "--repository-poll-secs=1")
    hc = httpclient.InferenceServerClient(k.url)
    _, scaler_pid, _ = scale_of(hc, httpclient)
    _, other_pid, _ = scale_of(hc, httpclient, "other")
    with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
        hc.load_model("scaler")

    # A changed config: only that model reloads, and its clients see no error meanwhile.
    client = _Inferrer(k.url, "scaler")
    client.start()
    try:
        wait_for(lambda: client.answers, what="first answer")
        set_scale(repo / "scaler", "10")
        wait_for(lambda: client.answers[-1][0] == 10.0, what="the new config served")
    finally:
        client.stop()
    assert client.errors == [], client.errors[:3]
    assert {s for s, _ in client.answers} == {2.0, 10.0}
    assert scale_of(hc, httpclient)[1] != scaler_pid
    assert scale_of(hc, httpclient, "other")[1] == other_pid  # untouched

    # A new version: served instead of version 1 (latest policy), version 1 is unloaded.
    shutil.copytree(repo / "scaler" / "1", repo / "scaler" / "2")
    wait_for(lambda: scale_of(hc, httpclient)[2] == 2, what="version 2 served")
    wait_for(lambda: states(k.url).get(("scaler", "1")) == ("UNAVAILABLE", "unloaded"), what="version 1 unloaded")
    assert states(k.url)[("scaler", "2")] == ("READY", "")
    _, v2_pid, _ = scale_of(hc, httpclient)

    # A change inside version 1 (not served) reloads nothing.
    (repo / "scaler" / "1" / "notes.txt").write_text("edited")
    # The version goes away: back to version 1.
    shutil.rmtree(repo / "scaler" / "2")
    wait_for(lambda: scale_of(hc, httpclient)[2] == 1, what="version 1 served again")
    assert scale_of(hc, httpclient)[1] != v2_pid

    # A new model appears; a model disappears.
    make_repo(repo, "third=scaler")
    wait_for(lambda: states(k.url).get(("third", "1")) == ("READY", ""), what="new model loaded")
    assert scale_of(hc, httpclient, "third")[0] == 2.0
    shutil.rmtree(repo / "other")
    wait_for(lambda: not hc.is_model_ready("other"), what="removed model unloaded")
    assert "other" not in {name for name, _ in states(k.url)}
    with pytest.raises(InferenceServerException):
        scale_of(hc, httpclient, "other")

    # A broken config: the served version stays; a fixed one is picked up again.
    config = repo / "scaler" / "config.pbtxt"
    good = config.read_text()
    config.write_text(good + "\nthis is not a config field\n")
    wait_for(lambda: "failed to load 'scaler'" in k.log(), what="the failed reload logged")
    assert scale_of(hc, httpclient)[0] == 10.0 and hc.is_model_ready("scaler")
    config.write_text(good.replace('string_value: "10"', 'string_value: "3"'))
    wait_for(lambda: scale_of(hc, httpclient)[0] == 3.0, what="the fixed config served")
    assert scale_of(hc, httpclient, "third")[0] == 2.0
    assert hc.is_server_ready()
    hc.close()
