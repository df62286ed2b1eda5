"""The on-disk cache of probe facts: a timed-out probe is not remembered."""

import copy

from fakes import machine as fake_machine


def test_facts_with_a_timed_out_probe_are_not_cached(monkeypatch, tmp_path):
    import overdrive.env as env_mod

    hung = copy.deepcopy(fake_machine())
    hung["probes"]["torch_native"] = {"_timeout": 60}
    calls = []
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OVERDRIVE_NO_ENV_CACHE", raising=False)
    monkeypatch.setattr(env_mod, "collect_facts", lambda: calls.append(1) or hung)
    env_mod.set_env(None)
    try:
        env_mod.get_env()
        env_mod.set_env(None)
        env_mod.get_env()  # a new process: probes again rather than trusting the hung probe
        assert len(calls) == 2
        monkeypatch.setattr(env_mod, "collect_facts", lambda: calls.append(1) or fake_machine())
        env_mod.set_env(None)
        env_mod.get_env()
        env_mod.set_env(None)
        env_mod.get_env()  # complete facts are cached as before
        assert len(calls) == 3
    finally:
        env_mod.set_env(None)
