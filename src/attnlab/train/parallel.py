"""How the loop runs a model over processes: one process, DistributedDataParallel, or FSDP2
(fully_shard over a one-dimensional device mesh). Each strategy gives the loop the same few things:

    loss(batch)        the objective's (loss, count) of this process's part of a global batch
    share(batch)       (this process's part, weight): data/sharding.py; the whole batch in one process
    sync(last)         gradient synchronisation on the last micro-batch of an accumulation window only
    model, optimizer   the plain model (evaluation, saved weights) and its optimizer (saved state);
    step_optimizer     the optimizer that steps (FSDP: over the shards)
    gather(), scatter()  FSDP: shards -> the plain twin before rank 0 saves or evaluates, and back
                       after a resume (torch.distributed.checkpoint.state_dict); no-ops otherwise

Gradients are summed over the processes (DDP: a sum all-reduce comm hook; FSDP: a sum
reduce-scatter), and the loop divides them by the global count of target tokens (train/loop.py), as
it does for the micro-batches of an accumulation window: the gradient of N processes on B/N each is
the gradient of one process on B.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from attnlab.data.sharding import share
from attnlab.train.distributed import World, current_world

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


class LossModule(nn.Module):
    """The objective's loss as a module's forward, so that DDP and FSDP see every use of the model
    (objectives call model.encode, model.mlm_logits ... rather than model.forward)."""

    def __init__(self, model: nn.Module, objective):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch):
        return self.objective.loss(self.model, batch)


class OneProcess:
    """Training in this process only: the loop's behaviour of before, unchanged."""

    def __init__(self, model: nn.Module, objective, make_optimizer: OptimizerFactory, world: World = World()):
        self.model, self.objective, self.world = model, objective, world
        self.optimizer = self.step_optimizer = make_optimizer(model)
        self.train_module: nn.Module = model

    def loss(self, batch):
        return self.objective.loss(self.model, batch)

    def share(self, batch):
        return batch, 1.0

    def sync(self, last: bool):
        return contextlib.nullcontext()

    def autocast(self):
        return contextlib.nullcontext()

    def gather(self) -> None:
        pass

    def scatter(self) -> None:
        pass


class _Distributed(OneProcess):
    def share(self, batch):
        """This process's rows of a global batch (data/sharding.share) and their weight."""
        rows, weight = share(self.objective.batch_rows(batch), self.world.rank, self.world.size)
        return self.objective.shard(batch, rows), weight

    def autocast(self):
        """bf16 autocast on CUDA (DDP's mixed precision); nothing on the CPU."""
        if self.world.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()


def _sum_hook(group, bucket):
    """DDP comm hook: all-reduce a gradient bucket as a sum (DDP's default divides by the world
    size; the loop divides by the global token count instead)."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class DDP(_Distributed):
    """DistributedDataParallel: a full replica in each process, gradients summed by all-reduce."""

    def __init__(self, model: nn.Module, objective, make_optimizer: OptimizerFactory, world: World):
        super().__init__(model.to(world.device), objective, make_optimizer, world)
        ids = [world.device.index] if world.device.type == "cuda" else None
        # Objectives that leave parameters unused (BERT's classifier under masked-LM) and experts no
        # token was routed to need DDP's search for unused parameters (a graph traversal per step).
        unused = getattr(objective, "leaves_parameters_unused", False) or bool(getattr(getattr(model, "cfg", None), "n_experts", 0))
        self.ddp = DistributedDataParallel(LossModule(self.model, objective), device_ids=ids,
                                           find_unused_parameters=unused)
        self.ddp.register_comm_hook(None, _sum_hook)
        self.train_module = self.ddp

    def loss(self, batch):
        return self.ddp(batch)

    def sync(self, last: bool):
        return contextlib.nullcontext() if last else self.ddp.no_sync()


def check_shardable(model: nn.Module) -> None:
    """Refuse a model FSDP2 cannot train here: one whose parameters a process may leave unused in a
    step while another uses them (mixture-of-experts routing), which would unbalance the
    reduce-scatter.

    Raises:
        ValueError: one line naming the model and the alternative.
    """
    if getattr(getattr(model, "cfg", None), "n_experts", 0):
        raise ValueError(f"parallel=fsdp cannot shard {type(model).__name__} with n_experts="
                         f"{model.cfg.n_experts}: experts unused on one process break FSDP's reduce-scatter; "
                         f"use --set parallel=ddp")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"parallel=fsdp: {type(model).__name__} has no trainable parameters to shard")


def _block_lists(model: nn.Module) -> list[nn.Module]:
    """The blocks of the model's outermost nn.ModuleLists (its layers): FSDP's units."""
    blocks, inside = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(p + ".") for p in inside):
            blocks.extend(module)
            inside.append(name)
    return blocks


class FSDP(_Distributed):
    """FSDP2: each process holds a shard of every parameter (fully_shard per layer and at the root,
    over init_device_mesh of all processes); bf16 parameters with fp32 gradient reduction on CUDA.

    A plain twin of the model and its optimizer (a full copy, on every process) serves evaluation and
    saved weights on rank 0 and resuming from a checkpoint (gather/scatter).
    """

    def __init__(self, model: nn.Module, objective, make_optimizer: OptimizerFactory, world: World):
        # Imported here: torch's FSDP and checkpoint packages take a second to import (sympy), which
        # every other command, and every run in one process or with DDP, would pay for nothing.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        check_shardable(model)
        model = model.to(world.device)
        twin = copy.deepcopy(model)
        super().__init__(twin, objective, make_optimizer, world)
        self.twin = LossModule(twin, objective)
        mesh = init_device_mesh(world.device.type, (world.size,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if world.device.type == "cuda" else MixedPrecisionPolicy()
        module = LossModule(model, objective)
        for block in _block_lists(model):
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(module, mesh=mesh, mp_policy=policy)
        for unit in [*_block_lists(model), module]:  # per FSDP unit: neither setting recurses
            unit.set_force_sum_reduction_for_comms(True)
            unit.set_gradient_divide_factor(1.0)  # a plain sum: the loop divides by the global count
        self.train_module = self.module = module
        self.step_optimizer = self._mirror(self.optimizer, module)
        self._names = {id(p): n for n, p in self.twin.named_parameters()}

    def _mirror(self, plain: torch.optim.Optimizer, module: nn.Module) -> torch.optim.Optimizer:
        """An optimizer of plain's class and groups over the sharded parameters of the same names."""
        names = {id(p): n for n, p in self.twin.named_parameters()}
        sharded = dict(module.named_parameters())
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [sharded[names[id(p)]] for p in g["params"]]} for g in plain.param_groups]
        mirror = type(plain)(groups)  # each group carries every setting of its own
        mirror.defaults.update(plain.defaults)
        return mirror

    def loss(self, batch):
        return self.module(batch)

    def sync(self, last: bool):
        self.module.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def autocast(self):
        return contextlib.nullcontext()  # the mixed-precision policy casts

    def _plain_optimizer_state(self, full: dict) -> dict:
        """A full optimizer state dict keyed by parameter names -> the twin optimizer's (by index)."""
        index = {}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                index[self._names[id(p)]] = len(index)
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
                  for g in full["param_groups"]]
        return {"state": {index[n]: s for n, s in full["state"].items()}, "param_groups": groups}

    def gather(self) -> None:
        """Every process sends its shards; rank 0's twin (model and optimizer) gets the full state."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)  # heavy: see __init__
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.module, options=options)
        moments = get_optimizer_state_dict(self.module, self.step_optimizer, options=options)
        if self.world.is_main:
            self.twin.load_state_dict(weights)
            self.optimizer.load_state_dict(self._plain_optimizer_state(moments))

    def scatter(self) -> None:
        """Every process loads its shards from its own twin (read from the checkpoint)."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)  # heavy: see __init__
        # Each tied tensor once (named_parameters keeps the first name): loading a second name of a
        # tied parameter fails on a tensor the first one already made a DTensor.
        weights = {**dict(self.twin.named_parameters()), **dict(self.twin.named_buffers())}
        set_model_state_dict(self.module, weights, options=StateDictOptions(full_state_dict=True, strict=False))
        options = StateDictOptions(full_state_dict=True)
        plain = self.optimizer.state_dict()
        by_index = {}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                by_index[len(by_index)] = self._names[id(p)]
        full = {"state": {by_index[i]: s for i, s in plain["state"].items()},
                "param_groups": [{**g, "params": [by_index[i] for i in g["params"]]} for g in plain["param_groups"]]}
        set_optimizer_state_dict(self.module, self.step_optimizer, full, options=options)


STRATEGIES = {"ddp": DDP, "fsdp": FSDP}


def make_strategy(model: nn.Module, objective, make_optimizer: OptimizerFactory, parallel: str):
    """The strategy of this process's World (train/distributed.py): OneProcess in one process,
    else DDP or FSDP as `parallel` says (TrainConfig.parallel)."""
    world = current_world()
    if not world.distributed:
        return OneProcess(model, objective, make_optimizer, world)
    return STRATEGIES[parallel](model, objective, make_optimizer, world)
