"""Split GGUFs (``NAME-00001-of-00003.gguf``): the first shard loads every shard, as llama_model_loader does.

The shards are written by ``gguf.GGUFWriter``'s own splitting (``split_max_tensors``); the expected
file layout (which tensor is in which shard, at which offset) is read back with ``gguf.GGUFReader``,
a reader independent of the toolkit's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(4)

from toolkit import cli  # noqa: E402
from toolkit.context import Context  # noqa: E402
from toolkit.errors import GGUFError  # noqa: E402
from toolkit.jaxrt.gguf_io import read_gguf, write_gguf  # noqa: E402
from toolkit.jaxrt.runtime import decode  # noqa: E402
from toolkit.models import ContextParams, presets  # noqa: E402
from toolkit.models.gguf_file import open_gguf, open_gguf_file  # noqa: E402

HP = dataclasses.replace(presets.tiny("f16"), n_vocab=128)
SHARDS = [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
PLAN = ("graph_nodes", "graph_nodes_tg", "graph_splits", "graph_splits_tg", "compute_buffers_bytes", "kv_bytes",
        "kv_buffers_bytes", "output_buffer_bytes", "n_copies", "pipeline_parallel", "max_nodes", "n_tensors")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("split")
    write_gguf(d / "one.gguf", HP, seed=7)
    write_gguf(d / "m.gguf", HP, seed=7, split_max_tensors=8)   # 21 tensors: 8 + 8 + 5
    return d


def _copy(models: Path, dst: Path) -> Path:
    for s in SHARDS:
        shutil.copy(models / s, dst / s)
    return dst


def _reader_spans(path: Path) -> list[tuple[int, int, int]]:
    """(tensor count, first data byte, last data byte) per shard, read by gguf.GGUFReader."""
    from gguf import GGUFReader
    out = []
    for s in SHARDS:
        r = GGUFReader(path / s)
        lo = min(int(t.data_offset) for t in r.tensors)
        hi = max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors)
        out.append((len(r.tensors), lo, hi))
    return out


def test_the_first_shard_brings_every_shard(models: Path) -> None:
    f = open_gguf(models / SHARDS[0])
    assert [Path(s.path).name for s in f.shards] == SHARDS
    assert [sum(t.file_index == i for t in f.tensors.values()) for i in range(3)] == [8, 8, 5]
    one = open_gguf(models / "one.gguf")
    assert list(f.tensors) == list(one.tensors)
    for name in one.tensors:   # every weight is read from its own shard, byte for byte the single file's
        assert np.array_equal(f.tensor_data(name), one.tensor_data(name)), name
    assert Path(f.tensor_path("output.weight")).name == SHARDS[2]
    assert read_gguf(f).hparams == dataclasses.replace(read_gguf(models / "one.gguf").hparams,
                                                       tensor_files={n: t.file_index for n, t in f.tensors.items()})


def test_plans_as_the_single_file_with_one_mapped_buffer_per_shard(models: Path) -> None:
    from toolkit.cases import log_lines, summary
    cp = ContextParams(n_ctx=256, n_batch=64, n_ubatch=32, n_gpu_layers=0, devices=("sim",))
    split = summary(Context(str(models / SHARDS[0]), cp))
    one = summary(Context(str(models / "one.gguf"), cp))
    for k in PLAN:
        assert split[k] == one[k], k
    # create_backend_buffers with mmap: one CPU_Mapped buffer per file, spanning its tensors' data
    spans = _reader_spans(models)
    assert split["model_buffer_lines"] == [["CPU_Mapped", hi - lo] for _, lo, hi in spans]
    assert split["model_buffers_bytes"] == {"CPU_Mapped": sum(hi - lo for _, lo, hi in spans)}
    from gguf import GGUFReader
    r = GGUFReader(models / "one.gguf")
    single = max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors) - min(int(t.data_offset) for t in r.tensors)
    assert one["model_buffer_lines"] == [["CPU_Mapped", single]]
    lines = [ln for ln in log_lines(split) if "model buffer size" in ln]
    assert len(lines) == 3 and all(ln.startswith("load_tensors:   CPU_Mapped model buffer size =") for ln in lines)
    # without mmap, one CPU buffer holds every shard's tensors, as for the single file
    nomap = dataclasses.replace(cp, use_mmap=False)
    assert (summary(Context(str(models / SHARDS[0]), nomap))["model_buffer_lines"]
            == summary(Context(str(models / "one.gguf"), nomap))["model_buffer_lines"])


def test_run_gives_the_single_files_logits(models: Path) -> None:
    cp = ContextParams(n_ctx=64, n_batch=32, n_ubatch=16, flash_attn="off", type_k="f32", type_v="f32",
                       devices=("sim",), n_gpu_layers=2)
    tokens = [3, 1, 4, 1, 5, 9]
    got = decode(Context(str(models / SHARDS[0]), cp), tokens)
    want = decode(Context(str(models / "one.gguf"), cp), tokens)
    assert got.shape == (6, HP.n_vocab)
    np.testing.assert_array_equal(got, want)


def test_cli_plans_the_first_shard(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["-c", "256", "-ngl", "0", "--device", "sim:1G"]
    assert cli.main(["plan", "-m", str(models / SHARDS[0]), *argv, "--json"]) == 0
    split = json.loads(capsys.readouterr().out)
    assert cli.main(["plan", "-m", str(models / "one.gguf"), *argv, "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    for k in PLAN:
        assert split[k] == one[k], k
    assert len(split["model_buffer_lines"]) == 3


def test_a_missing_shard_is_named(models: Path, tmp_path: Path) -> None:
    d = _copy(models, tmp_path)
    (d / SHARDS[1]).unlink()
    with pytest.raises(GGUFError, match="failed to load GGUF split 2 of 3 .*: no such file") as e:
        open_gguf(d / SHARDS[0])
    assert e.value.path == str(d / SHARDS[1])


def test_a_non_first_shard_is_refused(models: Path) -> None:
    with pytest.raises(GGUFError, match="illegal split file idx: 1, model must be loaded with the first split") as e:
        Context(str(models / SHARDS[1]), ContextParams(n_ctx=64))
    assert e.value.path == str(models / SHARDS[1]) and e.value.field == "split.no"
    assert f"({models / SHARDS[0]})" in str(e.value)


def test_a_shard_out_of_place_is_named(models: Path, tmp_path: Path) -> None:
    d = _copy(models, tmp_path)
    shutil.copy(models / SHARDS[1], d / SHARDS[2])   # shard 2 again where shard 3 should be
    with pytest.raises(GGUFError, match="invalid split file idx: 1, expected 2") as e:
        open_gguf(d / SHARDS[0])
    assert e.value.path == str(d / SHARDS[2])
    shutil.copy(models / SHARDS[0], d / SHARDS[2])   # the first shard again: its split.no is 0
    with pytest.raises(GGUFError, match="invalid split file idx: 0, expected 2"):
        open_gguf(d / SHARDS[0])


def test_a_tensor_count_mismatch_is_named(models: Path, tmp_path: Path) -> None:
    from gguf import GGUFWriter
    d = _copy(models, tmp_path)
    # shard 3 rewritten with one tensor fewer (split.tensors.count in shard 1 still says 21)
    r = open_gguf_file(models / SHARDS[2])
    w = GGUFWriter(str(d / SHARDS[2]), "llama")
    w.add_uint16("split.no", 2)
    w.add_uint16("split.count", 3)
    w.add_int32("split.tensors.count", 21)
    for name in list(r.tensors)[:-1]:
        w.add_tensor(name, np.array(r.tensor_data(name)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="corrupted model: 21 tensors expected but 20 found") as e:
        open_gguf(d / SHARDS[0])
    assert e.value.path == str(d / SHARDS[0]) and e.value.field == "split.tensors.count"


def test_a_renamed_first_shard_is_refused(models: Path, tmp_path: Path) -> None:
    shutil.copy(models / SHARDS[0], tmp_path / "first.gguf")
    with pytest.raises(GGUFError, match="invalid split file name"):
        open_gguf(tmp_path / "first.gguf")



def test_explain_sums_the_per_file_mapped_lines() -> None:
    """A log of a split model has one CPU_Mapped line per file: explain reads their sum (memory_breakdown's)."""
    from toolkit.explain.parse import parse_log
    log = Path(__file__).parent / "data" / "sched-debug" / "cpu-lfm2-c256-b512-ub512-faon-DEBUG.txt"
    text = log.read_text()
    one = parse_log(text).model_buffers["CPU_Mapped"]
    line = next(ln for ln in text.splitlines() if "CPU_Mapped model buffer size" in ln)
    a = one.value // 3
    two = (f"load_tensors:   CPU_Mapped model buffer size = {a / 2**20:8.2f} MiB ({a} bytes)\n"
           f"load_tensors:   CPU_Mapped model buffer size = {(one.value - a) / 2**20:8.2f} MiB ({one.value - a} bytes)")
    got = parse_log(text.replace(line, two)).model_buffers["CPU_Mapped"]
    assert one.exact and got.exact and got.value == one.value and a > 0


def test_the_run_cli_reads_every_shard(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from toolkit.jaxrt import cli as run_cli
    argv = ["--tokens", "5,6,7", "--devices", "sim:1", "--ngl", "2", "--parallel", "off", "--json"]
    assert run_cli.main(["--gguf", str(models / SHARDS[0]), *argv]) == 0
    split = json.loads(capsys.readouterr().out)["logits"]
    assert run_cli.main(["--gguf", str(models / "one.gguf"), *argv]) == 0
    one = json.loads(capsys.readouterr().out)["logits"]
    assert len(split) == HP.n_vocab and split == one


def test_a_model_dict_keeps_the_shards(models: Path) -> None:
    from toolkit.models.hparams import HParams
    hp = read_gguf(models / SHARDS[0], with_tensors=False).hparams
    d = json.loads(json.dumps(hp.to_dict()))
    assert HParams.from_dict(d) == hp and d["tensor_files"]["output.weight"] == 2
    assert "tensor_files" not in read_gguf(models / "one.gguf", with_tensors=False).hparams.to_dict()
