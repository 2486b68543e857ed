"""A finished warm start is found in the run's own folder, wherever the run was copied from."""

import json
import shutil

from horizonrl.cluster.warm_start import DONE_FILE, INIT_DIR, warm_start_model


def test_copied_run_uses_its_own_clone(tmp_path):
    origin = tmp_path / "origin" / "run"
    (origin / INIT_DIR / "model").mkdir(parents=True)
    assert warm_start_model(origin) is None  # not finished yet
    (origin / INIT_DIR / DONE_FILE).write_text(json.dumps(
        {"model": str((origin / INIT_DIR / "model").resolve())}))
    copy = tmp_path / "variant" / "run"
    shutil.copytree(origin, copy)
    shutil.rmtree(tmp_path / "origin")  # the run it was copied from is gone
    assert warm_start_model(copy) == (copy / INIT_DIR / "model").resolve()
