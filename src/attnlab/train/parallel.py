"""How the loop runs a model over processes: one process, DistributedDataParallel, or FSDP2
(fully_shard over a one-dimensional device mesh). Each strategy gives the loop the same few things:

    loss(batch)        the objective's (loss, count) of this process's part of a global batch
    share(batch)       (this process's part, weight): data/sharding.py; the whole batch in one process
    sync(last)         gradient synchronisation on the last micro-batch of an accumulation window only
    model, optimizer   the plain model (evaluation, saved weights) and its optimizer (saved state);
    step_optimizer     the optimizer that steps (FSDP: over the shards)
    gather(optimizer)  FSDP: the shards -> rank 0's plain model (and, for a checkpoint, its optimizer)
                       before rank 0 saves or evaluates (torch.distributed.checkpoint.state_dict)
    release()          FSDP: the training state is about to change: rank 0 frees its full copy
    scatter()          FSDP: rank 0's plain model and optimizer, read from a checkpoint -> every
                       process's shards (broadcast from rank 0)
The three are no-ops in one process and with DDP, whose plain model is the trained one.

Gradients are summed over the processes (DDP: a sum all-reduce comm hook; FSDP: a sum
reduce-scatter), and the loop divides them by the global count of target tokens (train/loop.py), as
it does for the micro-batches of an accumulation window: the gradient of N processes on B/N each is
the gradient of one process on B.
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from attnlab.data.sharding import share
from attnlab.errors import UserError
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

    def gather(self, optimizer: bool = False) -> None:
        pass

    def release(self) -> None:
        pass

    def scatter(self) -> None:
        pass


class _Distributed(OneProcess):
    def share(self, batch):
        """This process's rows of a global batch (data/sharding.share) and their weight."""
        rows, weight = share(self.objective.batch_rows(batch), self.world.rank, self.world.size)
        return self.objective.shard(batch, rows), weight

    def _order(self) -> list[str]:
        """The plain optimizer's parameters by index, named as in the wrapped module's state dicts."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return ["model." + names[id(p)] for g in self.optimizer.param_groups for p in g["params"]]

    def _renamed(self, state: dict, by_name: bool) -> dict:
        """An optimizer state dict keyed by parameter index (torch's) -> keyed by name (DCP's full
        state dicts), or back with by_name=False."""
        order = self._order()
        key = (lambda i: order[i]) if by_name else {n: i for i, n in enumerate(order)}.__getitem__
        return {"state": {key(k): v for k, v in state["state"].items()},
                "param_groups": [{**g, "params": [key(k) for k in g["params"]]} for g in state["param_groups"]]}

    def scatter(self) -> None:
        """Load every process's model and optimizer from rank 0's plain ones (read from a checkpoint
        by rank 0 alone), broadcast from rank 0 (torch.distributed.checkpoint.state_dict); for FSDP
        each process keeps its shards of it."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)  # heavy: see FSDP
        weights, full = {}, {}
        if self.world.is_main:
            # Each tied tensor once (named_parameters keeps the first name): loading a second name of
            # a tied parameter fails on a tensor the first one already made a DTensor.
            weights = {"model." + n: t.detach().clone()
                       for n, t in [*self.model.named_parameters(), *self.model.named_buffers()]}
            full = self._renamed(self.optimizer.state_dict(), by_name=True)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        set_model_state_dict(self.train_module, weights, options=options)
        set_optimizer_state_dict(self.train_module, self.step_optimizer, full,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def _sum_hook(group, bucket):
    """DDP comm hook: all-reduce a gradient bucket as a sum (DDP's default divides by the world
    size; the loop divides by the global token count instead)."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class DDP(_Distributed):
    """DistributedDataParallel: a full replica in each process, gradients summed by all-reduce."""

    def __init__(self, model: nn.Module, objective, make_optimizer: OptimizerFactory, world: World):
        super().__init__(model.to(world.device), objective, make_optimizer, world)
        # Objectives that leave parameters unused (BERT's classifier under masked-LM) and experts no
        # token was routed to need DDP's search for unused parameters (a graph traversal per step).
        unused = objective.leaves_parameters_unused or bool(getattr(getattr(model, "cfg", None), "n_experts", 0))
        self.ddp = DistributedDataParallel(LossModule(self.model, objective), device_ids=None,
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
        raise UserError(f"parallel=fsdp cannot shard {type(model).__name__} with n_experts="
                        f"{model.cfg.n_experts}: experts unused on one process break FSDP's reduce-scatter; "
                        f"use --set parallel=ddp")
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError(f"parallel=fsdp: {type(model).__name__} has no trainable parameters to shard")


def _block_lists(model: nn.Module) -> list[nn.Module]:
    """The blocks of the model's outermost nn.ModuleLists (its layers): FSDP's units."""
    blocks, inside = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(p + ".") for p in inside):
            blocks.extend(module)
            inside.append(name)
    return blocks


def free_parameters(model: nn.Module) -> None:
    """Drop the storage of every parameter of `model` (each tied parameter once), keeping the
    Parameter objects (and so the optimizer's references and the ties); buffers stay."""
    for p in model.parameters():
        p.data = p.data.new_empty(0)


def hold_parameters(model: nn.Module, shapes: dict[int, torch.Size]) -> None:
    """Give every freed parameter of `model` (free_parameters) uninitialised storage of its shape."""
    for p in model.parameters():
        if p.numel() != math.prod(shapes[id(p)]):
            p.data = p.data.new_empty(shapes[id(p)])


class FSDP(_Distributed):
    """FSDP2: each process holds a shard of every parameter, of its gradient and of Adam's moments
    (fully_shard per layer and at the root, over init_device_mesh of all processes). Parameters,
    gradients and their reduction are fp32 (`--set autocast=bf16` casts the products, as in one
    process).

    The plain model and optimizer are shells (parameters without storage, no optimizer state) on
    every process but rank 0 while it evaluates or saves: gather() fills rank 0's from the shards
    (full_state_dict with cpu_offload: the other processes never hold a full tensor), release() empties
    them again at the next step. A resume reads the checkpoint on rank 0 alone and scatter()
    broadcasts it into every process's shards. So training memory per process is 1/N of the
    parameters, gradients and moments, plus one layer's full parameters at a time (FSDP's
    all-gather); rank 0 holds a full copy only while it evaluates or writes.
    """

    def __init__(self, model: nn.Module, objective, make_optimizer: OptimizerFactory, world: World):
        # Imported here: torch's FSDP and checkpoint packages take a second to import (sympy), which
        # every other command, and every run in one process or with DDP, would pay for nothing.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        check_shardable(model)
        model = model.to(world.device)
        plain = copy.deepcopy(model)
        super().__init__(plain, objective, make_optimizer, world)
        self._shapes = {id(p): p.shape for p in plain.parameters()}
        # Whether rank 0's copy holds the trained state (the same on every process: it decides the
        # collectives): at first it does (the initial weights, no moments yet).
        self._current = {"weights": True, "optimizer": True}
        if not world.is_main:
            free_parameters(plain)
        mesh = init_device_mesh(world.device.type, (world.size,))
        module = LossModule(model, objective)
        for block in _block_lists(model):
            fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh)
        for unit in [*_block_lists(model), module]:  # per FSDP unit: neither setting recurses
            unit.set_force_sum_reduction_for_comms(True)
            unit.set_gradient_divide_factor(1.0)  # a plain sum: the loop divides by the global count
        self.train_module = self.module = module
        self.step_optimizer = self._mirror(self.optimizer, module)

    def _mirror(self, plain: torch.optim.Optimizer, module: nn.Module) -> torch.optim.Optimizer:
        """An optimizer of plain's class and groups over the sharded parameters of the same names."""
        sharded, names = dict(module.named_parameters()), iter(self._order())
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [sharded[next(names)] for _ in g["params"]]}
                  for g in plain.param_groups]
        mirror = type(plain)(groups)  # each group carries every setting of its own
        mirror.defaults.update(plain.defaults)
        return mirror

    def loss(self, batch):
        return self.module(batch)

    def sync(self, last: bool):
        self.module.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def gather(self, optimizer: bool = False) -> None:
        """Fill rank 0's plain model (and, with `optimizer`, its optimizer's state) from every
        process's shards; every process takes part. Nothing is gathered twice between two steps."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)  # heavy: see __init__
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full tensors on rank 0 only
        if not self._current["weights"]:
            weights = get_model_state_dict(self.module, options=options)
            if self.world.is_main:
                hold_parameters(self.model, self._shapes)
                self.model.load_state_dict({k.removeprefix("model."): v for k, v in weights.items()})
            self._current["weights"] = True
        if optimizer and not self._current["optimizer"]:
            full = get_optimizer_state_dict(self.module, self.step_optimizer, options=options)
            if self.world.is_main:
                self.optimizer.load_state_dict(self._renamed(full, by_name=False))
            self._current["optimizer"] = True

    def release(self) -> None:
        """The shards are about to change: rank 0 frees its full copy (weights and moments)."""
        if self.world.is_main and (self._current["weights"] or self._current["optimizer"]):
            free_parameters(self.model)
            self.optimizer.state.clear()
        self._current = {"weights": False, "optimizer": False}

    def scatter(self) -> None:
        """Every process's shards from rank 0's plain model and optimizer (_Distributed.scatter)."""
        super().scatter()
        self._current = {"weights": True, "optimizer": True}


STRATEGIES = {"ddp": DDP, "fsdp": FSDP}


def make_strategy(model: nn.Module, objective, make_optimizer: OptimizerFactory, parallel: str):
    """The strategy of this process's World (train/distributed.py): OneProcess in one process,
    else DDP or FSDP as `parallel` says (TrainConfig.parallel)."""
    world = current_world()
    if not world.distributed:
        return OneProcess(model, objective, make_optimizer, world)
    return STRATEGIES[parallel](model, objective, make_optimizer, world)
