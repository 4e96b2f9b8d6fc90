"""One weight update of verl through the "hwfs" checkpoint engine (run by
tests/verl/test_verl.py with build/venv-verl's python, one process per round).

What runs is verl's own code, with its real configs:

* the actor side is verl's ActorRolloutRefWorker.update_weights (the method a
  trainer's actor workers run), on a worker built as verl's own CPU test
  (tests/checkpoint_engine/test_global_steps_on_cpu.py) builds it, whose
  checkpoint engine is made from a CheckpointEngineConfig the way
  ActorRolloutRefWorker.init_model makes it (import_external_libs of
  custom_backend_module, then CheckpointEngineRegistry.new(backend,
  is_master=..., bucket_size=..., **engine_kwargs[backend]));  its model
  engine yields the state dict of a small Hugging Face Llama, as verl's model
  engines' get_per_tensor_param do;
* the rollout side is verl's CheckpointEngineWorker, constructed by its own
  __init__ (which builds the engine through the registry), with the
  MockServerAdapter verl's nccl/nixl tests use (tests.checkpoint_engine.test_utils,
  shipped in verl's wheel): it receives every (name, tensor) and its
  check_weights() compares them with the model on disk;
* the two run as CheckpointEngineManager runs them: prepare on both,
  build_topology of the registered class, init_process_group, then both
  update_weights concurrently (the rollout's first: it waits for the
  version), then finalize on both.

Prints one JSON line: the version, the actor's metrics, what was received.
"""

import argparse
import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import torch


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ModelEngine:
    """What ActorRolloutRefWorker.update_weights asks of verl's model engine."""

    def __init__(self, model):
        self.model = model

    def get_per_tensor_param(self, **kwargs):
        return ((n, t) for n, t in self.model.state_dict().items()), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--model", required=True, help="a Hugging Face model directory")
    ap.add_argument("--step", type=int, required=True)
    ap.add_argument("--out", required=True, help="safetensors file of what the rollout received")
    ap.add_argument("--perturb", default="[]",
                    help='JSON [[tensor name, flat index, delta], ...] applied to the actor first')
    ap.add_argument("--hwfs-bin", required=True)
    ap.add_argument("--overrides", required=True,
                    help="JSON list of dotlist overrides of rollout's config (checkpoint_engine.*)")
    ap.add_argument("--verl-check", action="store_true",
                    help="also run MockServerAdapter.check_weights (the model on disk)")
    a = ap.parse_args()

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))

    from omegaconf import OmegaConf
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from tests.checkpoint_engine.test_utils import CheckpointEngineWorkerTest  # verl's
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import import_external_libs
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker

    # verl's own rollout.checkpoint_engine defaults (trainer/config/rollout/rollout.yaml),
    # with the overrides a user gives on the command line (docs/engines.md, "verl")
    import verl
    defaults = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/rollout/rollout.yaml")
    overrides = OmegaConf.from_dotlist(json.loads(a.overrides) + [
        f"checkpoint_engine.engine_kwargs.hwfs.hwfs_bin={a.hwfs_bin}",
        "checkpoint_engine.engine_kwargs.hwfs.wait_timeout_s=120",
    ])
    ce_node = OmegaConf.merge({"checkpoint_engine": defaults.checkpoint_engine}, overrides)
    cfg = OmegaConf.create({"rollout": {"name": "vllm", **ce_node}})

    # -- rollout side: verl's CheckpointEngineWorker, by its own __init__
    ce_config = omega_conf_to_dataclass(cfg.rollout.checkpoint_engine)
    rollout_config = RolloutConfig(name="vllm", checkpoint_engine=ce_config)
    model_config = HFModelConfig(path=a.model, load_tokenizer=False)
    rollout = CheckpointEngineWorkerTest(rollout_config, model_config, check_allclose=True)

    # -- actor side: ActorRolloutRefWorker with the engine init_model builds
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
    with torch.no_grad():
        sd = model.state_dict()
        for name, idx, delta in json.loads(a.perturb):
            sd[name].view(-1)[idx] += delta
    actor = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    actor.config = cfg
    actor.actor = SimpleNamespace(engine=ModelEngine(model))
    engine_config = omega_conf_to_dataclass(cfg.rollout.checkpoint_engine)
    backend = engine_config.backend
    import_external_libs(engine_config.custom_backend_module or None)
    actor.checkpoint_engine = CheckpointEngineRegistry.new(
        backend, is_master=(torch.distributed.get_rank() == 0),
        bucket_size=engine_config.update_weights_bucket_megabytes << 20,
        **engine_config.engine_kwargs.get(backend, {}))

    # -- CheckpointEngineManager's sequence, without Ray
    backend_cls = CheckpointEngineRegistry.get(backend)
    execute = (ActorRolloutRefWorker.execute_checkpoint_engine.__wrapped__,
               type(rollout).execute_checkpoint_engine.__wrapped__)
    metadata = [execute[0](actor, "prepare"), execute[1](rollout, "prepare")]
    actor_kw, rollout_kw = backend_cls.build_topology(1, 1, metadata)
    execute[0](actor, "init_process_group", **{k: v[0] for k, v in actor_kw.items()})
    execute[1](rollout, "init_process_group", **{k: v[0] for k, v in rollout_kw.items()})

    async def update():
        receiving = asyncio.ensure_future(
            type(rollout).update_weights.__wrapped__(rollout, global_steps=a.step))
        await asyncio.sleep(0)  # the rollout is waiting for the version before the actor sends
        metrics = await ActorRolloutRefWorker.update_weights.__wrapped__(
            actor, global_steps=a.step, mode="auto")
        await receiving
        return metrics

    metrics = asyncio.run(update())
    received = dict(rollout.server_adapter.received_weights)
    execute[0](actor, "finalize")
    execute[1](rollout, "finalize")

    save_file({k: v.contiguous() for k, v in received.items()}, a.out)
    if a.verl_check:
        rollout.check_weights()
    print(json.dumps({"version": actor.checkpoint_engine.last_version,
                      "rollout_version": rollout.checkpoint_engine.last_version,
                      "engine": type(rollout.checkpoint_engine).__module__,
                      "metrics": metrics, "received": sorted(received)}))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
