"""Each learner rank trains on the device Ray assigned it: a local Ray that advertises two
(logical) GPUs gives the two ranks of a LearnerGroup one GPU id each, never the same, and each
rank's CUDA ordinal is that GPU's place in what Ray made visible to it. On this CPU machine
the ranks then fall back to CPU (no CUDA) and still train."""

import pytest

from horizonrl.learner.worker import local_gpu_ordinal

pytestmark = [pytest.mark.integration, pytest.mark.own_ray]  # ray.init with made-up GPUs


def test_ordinal_is_the_place_of_the_assigned_gpu():
    assert local_gpu_ordinal([], "0,1") is None  # no GPU reserved: CPU, not cuda:0
    assert local_gpu_ordinal(["3"], "3") == 0  # Ray's usual: only the assigned GPU visible
    assert local_gpu_ordinal(["3"], "1,3") == 1
    assert local_gpu_ordinal([2], None) == 2  # Ray told not to set CUDA_VISIBLE_DEVICES
    with pytest.raises(RuntimeError, match="assigned GPU 4"):
        local_gpu_ordinal(["4"], "0,1")


def test_two_ranks_get_two_gpus_from_ray(tiny_model_path, tokenizer):
    import ray

    from horizonrl.cluster.ops.runtime import LOCAL_RAY_ENV
    from horizonrl.learner.config import LearnerConfig
    from horizonrl.learner.group import LearnerGroup

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": LOCAL_RAY_ENV})
    try:
        cfg = LearnerConfig(world_size=2, num_gpus_per_worker=1, kl_coef=0.0)
        group = LearnerGroup(cfg, model_path=str(tiny_model_path),
                             pad_id=tokenizer.pad_token_id, seed=0)
        try:
            got = ray.get([w.assigned_gpu.remote() for w in group.workers])
            devices = ray.get([w.weight_device.remote() for w in group.workers])
        finally:
            group.shutdown()
    finally:
        ray.shutdown()
    (ids0, ord0), (ids1, ord1) = got
    assert len(ids0) == len(ids1) == 1 and ids0 != ids1, got
    assert ord0 == ord1 == 0, got  # each sees only its own GPU
    assert devices == [None, None]  # no CUDA here: the ranks trained on CPU


@pytest.mark.slow  # two vLLM engines (~30 s); the ranks' GPU check above stays in the default set
def test_two_generators_get_two_gpus_from_ray(tiny_model_path):
    """Each generator actor sees exactly the GPU Ray reserved for it, first among the visible
    devices (where vLLM builds its engine), and two generators never share one."""
    import ray

    from horizonrl.actors.config import GeneratorConfig
    from horizonrl.actors.generator import GeneratorActor
    from horizonrl.cluster.ops.runtime import LOCAL_RAY_ENV
    from horizonrl.envpool.config import EnvConfig
    from horizonrl.envpool.pool import EnvPool
    from horizonrl.learner.ingest import TrajectoryIngest

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": LOCAL_RAY_ENV})
    try:
        cfg = GeneratorConfig(num_gpus=1, num_cpus=0.5, max_context_tokens=256)
        with TrajectoryIngest(port=0) as ingest:
            remote = ray.remote(num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus)(GeneratorActor)
            gens = [remote.remote(name=f"gen{i}", cfg=cfg, model_path=str(tiny_model_path),
                                  env_pools=[EnvPool(EnvConfig(replicas_per_actor=1,
                                                               num_cpus_per_actor=0.1),
                                                     name=f"dev{i}")],
                                  ingest_address=ingest.address, seed=i) for i in range(2)]
            got = ray.get([g.assigned_gpu.remote() for g in gens], timeout=600)
    finally:
        ray.shutdown()
    (ids0, vis0), (ids1, vis1) = got
    assert len(ids0) == len(ids1) == 1 and ids0 != ids1, got
    assert vis0 == ids0[0] and vis1 == ids1[0], got
