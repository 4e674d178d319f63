"""A llama.cpp command line planned the way the program runs it.

With ``--fit on`` (llama.cpp's default) ``common_init_result`` calls ``common_fit_params`` before
the model is loaded and continues with the parameters as fit left them (its own tensor split,
even where the printed line of ``llama-fit-params`` would drop it), also after a refused fit.
:func:`plan_args` does the same when every model device's memory is known, then plans the
context and reads its buffers and the memory breakdown table printed at exit.
"""

from __future__ import annotations

from typing import Any

from toolkit.args import LlamaArgs, load_model_arg
from toolkit.cases import summary
from toolkit.errors import ParameterError, ToolkitError, UnsupportedFeature
from toolkit.fit.impl import fit_params
from toolkit.fit.probe import default_split
from toolkit.fit.real import run_params
from toolkit.memory import breakdown_table, context_breakdown, device_memory
from toolkit.models.hparams import HParams


def plan_args(args: LlamaArgs, model: HParams | None = None,
              contexts: list[Any] | None = None) -> dict[str, Any]:
    """What :func:`~toolkit.cases.plan_case` returns for a command line, plus ``fit_log_lines``
    (when fit ran), ``fitted`` and ``memory_breakdown`` (when every device's memory is known)."""
    from toolkit.context import Context  # the context layer sits below fit
    hp = model if model is not None else load_model_arg(args.model)
    try:
        mem = device_memory(args)
    except ParameterError:
        mem = None                              # an RPC server without --device-memory
    cp = args.context_params()
    out: dict[str, Any] = {"id": args.model}
    if mem is not None and len(mem) > 1:
        cp = cp.replace(tensor_split=default_split(cp, mem))
    if args.fit and mem is not None and (mem or args.host_memory):
        r = fit_params(hp, args, mem)
        out["fit_log_lines"] = [line for line in r.log_lines if not line.startswith("llama_fit_params:")]
        out["fitted"] = r.fitted.to_dict()
        cp = run_params(args, r.fitted, mem, in_process=True)
    elif args.fit:
        why = ("the host's memory is unknown (give --device cpu:SIZE)" if mem == [] else
               "the free memory of a device is unknown (give --device-memory, or device strings with sizes)")
        out["fit_log_lines"] = [f"common_fit_params: not fitting: {why}"]
    try:
        ctx = Context(hp, cp)
    except UnsupportedFeature:
        raise
    except ToolkitError as e:  # llama_init_from_model refuses the context: its message
        return {**out, "error": e.llama_text or str(e)}
    if contexts is not None:                    # the caller keeps the context (plan --html)
        contexts.append(ctx)
    out.update(summary(ctx))
    bd, _ = context_breakdown(ctx, exact=True)
    out["memory_breakdown"] = breakdown_table(bd, mem) if mem is not None else None
    return out


__all__ = ["plan_args"]
