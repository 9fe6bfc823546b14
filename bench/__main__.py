"""`python -m bench [...]` (step-time benchmark), `python -m bench ttq [...]` (time to quality),
`python -m bench curves [...]` (whole runs against upstream's own code), `python -m bench ttsc
[...]` (a trained TRM's test-time scaling), `python -m bench trainer [...]` (the trainer's loop
against its bare jitted step, same batches), `python -m bench demo [...]` (`make demo` over seeds),
`python -m bench timings [...]` (`make demo` and `make test` from a fresh clone) and `python -m
bench gpu [...]` (one GPU session's whole plan, time-boxed)."""

import sys

from train.errors import user_errors


def _main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "ttq":
        from bench.ttq import main as ttq_main

        ttq_main(argv[1:])
    elif argv and argv[0] == "ttsc":
        from bench.ttsc import main as ttsc_main

        ttsc_main(argv[1:])
    elif argv and argv[0] == "curves":
        from bench.curves import main as curves_main

        curves_main(argv[1:])
    elif argv and argv[0] == "trainer":
        from bench.trainer_vs_bare import main as trainer_main

        trainer_main(argv[1:])
    elif argv and argv[0] == "demo":
        from bench.demo import main as demo_main

        demo_main(argv[1:])
    elif argv and argv[0] == "timings":
        from bench.timings import main as timings_main

        timings_main(argv[1:])
    elif argv and argv[0] == "gpu":
        from bench.gpu import main as gpu_main

        gpu_main(argv[1:])
    else:
        from bench.harness import main

        main(argv)


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        _main()
