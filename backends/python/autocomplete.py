"""Runs a model's `auto_complete_config` in a throw-away interpreter.

Started by the backend as `python -m kernel.backends.python.autocomplete --model-file F`
with the config JSON on stdin; prints the completed config JSON on the original
stdout. Anything the model prints goes to stderr (the server log) instead, so
it cannot corrupt the result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kernel-python-autocomplete")
    parser.add_argument("--model-file", required=True)
    args = parser.parse_args(argv)
    sys.argv = [""]  # what the model sees in its worker too (see worker.main)
    result_out = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # the model's prints must not mix with the result
    config = json.loads(sys.stdin.read() or "{}")
    try:
        import triton_python_backend_utils as pb_utils
        from kernel.backends.python.model_import import load_model_class
        from kernel.backends.python.worker_log import format_exception

        cls = load_model_class(args.model_file)
        hook = getattr(cls, "auto_complete_config", None)
        if hook is not None:
            completed = hook(pb_utils.ModelConfig(config))
            if not isinstance(completed, pb_utils.ModelConfig):
                raise TypeError(
                    f"auto_complete_config function in model '{config.get('name', '')}' must return "
                    "a valid pb.ModelConfig object."
                )
            config = completed.as_dict()
    except BaseException as exc:  # noqa: BLE001 - reported to the front process
        json.dump({"error": format_exception(exc)}, result_out)
        result_out.flush()
        return 1
    json.dump({"config": config}, result_out)
    result_out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
