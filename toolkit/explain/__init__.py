"""Read a llama.cpp start-up log, rebuild the context it describes, and compare every number.

:func:`parse_log` reads the lines ``llama-server`` / ``llama-cli`` / ``llama-completion`` print at
start-up (``llama_model_loader:``, ``print_info:``, ``load_tensors:``, ``llama_context:``,
``llama_kv_cache:``, ``sched_reserve:``, the memory breakdown); :func:`from_log` turns them into
hyperparameters (through the registered architecture's ``read_hparams``, as for a GGUF file) and
context parameters; :func:`explain` reserves the rebuilt context and lists llama.cpp's numbers beside
the toolkit's (:class:`Explanation`).
"""

from toolkit.explain.compare import Compared, Explanation, explain
from toolkit.explain.parse import LoggedBuffer, ParsedLog, parse_log
from toolkit.explain.rebuild import LoggedRun, from_log

__all__ = ["Compared", "Explanation", "LoggedBuffer", "LoggedRun", "ParsedLog", "explain", "from_log", "parse_log"]
