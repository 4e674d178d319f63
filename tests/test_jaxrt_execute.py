"""The executor on graphs built with toolkit.ggml ops: scheduled on 1–3 devices == unscheduled."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(4)

import jax.numpy as jnp  # noqa: E402

from toolkit.backend import Backend, Buffer  # noqa: E402
from toolkit.ggml import F16, F32, I32, Q8_0, BufferUsage, GGMLType, Graph, Tensor, ops  # noqa: E402
from toolkit.jaxrt import layout  # noqa: E402
from toolkit.jaxrt.compile import CompileCache  # noqa: E402
from toolkit.jaxrt.devices import make_backends  # noqa: E402
from toolkit.jaxrt.execute import GraphRunner  # noqa: E402
from toolkit.jaxrt.kernels import eval_nodes  # noqa: E402
from toolkit.sched.scheduler import Scheduler  # noqa: E402

I64 = GGMLType.I64
E, FF, V, KV = 32, 64, 50, 64


class Mini:
    """A llama-like graph: embeddings, per layer rms_norm, K written to a cache by set_rows,
    attention over the cache view, swiglu FFN; weights of layer l on ``layer_backend[l]``."""

    def __init__(self, backends: list[Backend], n_layer: int, n_gpu_layers: int, wtype: GGMLType = F32) -> None:
        rng = np.random.default_rng(7)
        self.backends = backends
        gpu = [b for b in backends if not b.is_cpu]
        self.weights: dict[str, tuple[Tensor, np.ndarray]] = {}
        self.caches: list[Tensor] = []
        self.n_layer = n_layer

        def home(layer: int) -> Backend:
            # layers n_layer - n_gpu_layers .. n_layer - 1 go to the accelerators, split evenly
            first = n_layer - min(n_gpu_layers, n_layer)
            if not gpu or layer < first:
                return backends[-1]
            return gpu[(layer - first) * len(gpu) // max(1, n_layer - first)]

        def w(name: str, ne: tuple[int, ...], b: Backend, type_: GGMLType = F32) -> Tensor:
            t = Tensor(type_, ne, name=name)
            t.buffer = Buffer(b.buft, t.nbytes, BufferUsage.WEIGHTS)
            vals = (rng.standard_normal(ne[::-1]) * 0.2).astype(np.float32)
            if type_ is Q8_0:
                from gguf import GGMLQuantizationType, quants
                t.data = quants.quantize(vals, GGMLQuantizationType.Q8_0)
            else:
                t.data = vals
            self.weights[name] = (t, vals)
            return t

        cpu = backends[-1]
        self.tok = w("token_embd.weight", (E, V), cpu)
        self.layers = []
        for il in range(n_layer):
            b = home(il)
            cache = Tensor(F16, (E, KV), name=f"cache_k_l{il}")
            cache.buffer = Buffer(b.buft, cache.nbytes, BufferUsage.ANY)
            self.caches.append(cache)
            self.layers.append(dict(
                norm=w(f"blk.{il}.attn_norm.weight", (E,), b), wk=w(f"blk.{il}.attn_k.weight", (E, E), b, wtype),
                gate=w(f"blk.{il}.ffn_gate.weight", (E, FF), b, wtype), up=w(f"blk.{il}.ffn_up.weight", (E, FF), b),
                down=w(f"blk.{il}.ffn_down.weight", (FF, E), b, wtype), cache=cache))
        ob = gpu[-1] if gpu and n_gpu_layers > n_layer else cpu
        self.out = w("output.weight", (E, V), ob, wtype)

    def graph(self, n_tokens: int) -> tuple[Graph, dict[str, Tensor], Tensor]:
        tokens = ops.new_tensor_1d(I32, n_tokens, "inp_tokens").set_input()
        idx = ops.new_tensor_1d(I64, n_tokens, "k_idxs").set_input()
        mask = ops.new_tensor_2d(F32, KV, n_tokens, "kq_mask").set_input()
        g = Graph(1024)
        x = ops.get_rows(self.tok, tokens)
        for L in self.layers:
            h = ops.mul(ops.rms_norm(x, 1e-5), L["norm"])
            k = ops.mul_mat(L["wk"], h)
            g.build_forward_expand(ops.set_rows(L["cache"], k, idx))
            kv = ops.view_2d(L["cache"], E, KV, L["cache"].nb[1], 0)
            sm = ops.soft_max_ext(ops.mul_mat(kv, h), mask, E ** -0.5, 0.0)
            att = ops.mul_mat(ops.cont(ops.transpose(kv)), sm)
            x = ops.add(x, att)
            f = ops.mul_mat(L["down"], ops.swiglu_split(ops.mul_mat(L["gate"], x), ops.mul_mat(L["up"], x)))
            x = ops.add(x, f)
        logits = ops.mul_mat(self.out, x).set_name("result_output").set_output()
        g.build_forward_expand(logits)
        return g, {"tokens": tokens, "idx": idx, "mask": mask}, logits


def feeds(inp: dict[str, Tensor], tokens: list[int], pos0: int) -> dict[Tensor, np.ndarray]:
    n = len(tokens)
    pos = np.arange(pos0, pos0 + n)
    mask = np.where(np.arange(KV)[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float32)
    return {inp["tokens"]: np.array(tokens, np.int32), inp["idx"]: pos.astype(np.int64), inp["mask"]: mask}


def reference(model: Mini, steps: list[list[int]]) -> list[np.ndarray]:
    """Unscheduled: the same graphs evaluated node by node on one device, KV carried by hand."""
    caches = {c: jnp.zeros(layout.storage_units(c), jnp.float16) for c in model.caches}
    out, pos = [], 0
    for toks in steps:
        g, inp, logits = model.graph(len(toks))
        vals = {t: jnp.asarray(layout.host_storage(t, t.data)) for t, _ in model.weights.values()}
        vals.update(caches)
        vals.update({t: jnp.asarray(layout.host_storage(t, v)) for t, v in feeds(inp, toks, pos).items()})
        env = eval_nodes(g.nodes, vals)
        caches = {c: env.values[c] for c in model.caches}
        out.append(np.asarray(env.read(logits)).reshape(len(toks), V))
        pos += len(toks)
    return out


def scheduled(model: Mini, steps: list[list[int]], *, parallel: bool = False, op_offload: bool = False,
              runner: GraphRunner | None = None) -> tuple[list[np.ndarray], GraphRunner, list[int]]:
    runner = runner or GraphRunner(model.backends, CompileCache())
    sched = Scheduler(model.backends, None, 2048, parallel, op_offload)
    out, pos, n_splits = [], 0, []
    for toks in steps:
        g, inp, logits = model.graph(len(toks))
        sched.reset()
        assert sched.alloc_graph(g)
        res = runner.execute(sched, g, feeds(inp, toks, pos), [logits])
        out.append(runner.read(res[logits], logits).reshape(len(toks), V))
        n_splits.append(sched.n_splits)
        pos += len(toks)
    return out, runner, n_splits


STEPS = [[3, 1, 4, 1, 5, 9, 2, 6], [5], [3]]


def close(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for x, y in zip(a, b):
        err = np.abs(x - y).max() / np.abs(y).max()
        assert err < 1e-5, err


def test_single_cpu_matches_unscheduled() -> None:
    m = Mini(make_backends("cpu"), 2, 0)
    got, runner, n_splits = scheduled(m, STEPS)
    close(got, reference(m, STEPS))
    assert n_splits == [1, 1, 1]
    # the same split signature compiles once and then hits the cache
    assert [ps.cache_hit for ps in runner.last_splits] == [True]


@pytest.mark.parametrize("ngl", [0, 2, 5])
def test_three_simulated_accelerators(ngl: int) -> None:
    m = Mini(make_backends("sim:2"), 4, ngl)
    got, runner, n_splits = scheduled(m, STEPS)
    close(got, reference(m, STEPS))
    if ngl:
        assert n_splits[0] > 1 and runner.last_stats.n_copies > 0


def test_op_offload_copies_host_weights_each_eval() -> None:
    m = Mini(make_backends("sim:1"), 2, 0)
    steps = [list(range(40)), [7]]  # batch 40 >= 32: MUL_MATs of CPU weights offload to SIM0
    on, rt_on, _ = scheduled(m, steps, op_offload=True)
    assert rt_on.last_stats.weight_copies == 0  # the 1-token step does not offload
    off, rt_off, _ = scheduled(m, steps[:1], op_offload=False)
    close(on[:1], off)
    close(on, reference(m, steps))
    on1, rt1, _ = scheduled(m, steps[:1], op_offload=True)
    assert rt1.last_stats.weight_copies > 0 and rt_off.last_stats.weight_copies == 0


def test_pipeline_parallel_rotates_copies() -> None:
    m = Mini(make_backends("sim:2"), 4, 5)
    steps = [[1, 2, 3], [4], [5], [6], [7]]
    got, runner, _ = scheduled(m, steps, parallel=True)
    close(got, reference(m, steps))
    assert runner.cache.misses <= 2 * len(runner.last_splits) + 2  # copies rotate, the programs stay the same


def test_quantized_weights_on_accelerator() -> None:
    m = Mini(make_backends("sim:1"), 2, 5, wtype=Q8_0)
    got, _, _ = scheduled(m, STEPS[:2])
    close(got, reference(m, STEPS[:2]))
