"""The same TorchScript minilm called from different threads, and next to a busy Python thread.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/torch_threads.py [--weights DIR]

Median milliseconds per call (inputs copied in, output copied back, as serving does) at batch
1, 32 and 128 when the call is made on the main thread, handed to a 32-thread pool that already
ran a burst of concurrent calls (each call may land on another thread, as on Serval's shared
engine pool), or handed to one thread of its own. Then batch 1 and 32 again while another
thread runs pure Python, as a busy event loop does: torch releases the GIL in every operation
and must take it back after each, waiting up to the interpreter's switch interval (5 ms) every
time. On CUDA where there is one, else on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import gpu_minilm

WAYS = ("main", "pool", "one")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    calls = 100 if device == "cuda" else 10
    encoder = gpu_minilm.load_encoder(args.weights)
    program = gpu_minilm.traced_program(encoder, device, torch.float32)
    pool, own = ThreadPoolExecutor(32), ThreadPoolExecutor(1)
    list(pool.map(lambda _: gpu_minilm.raw_call(program, device, 1)(), range(64)))

    def timed(call: Callable[[], None], way: str, count: int) -> float:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            if way == "main":
                call()
            else:
                (pool if way == "pool" else own).submit(call).result()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000

    print(f"device: {device}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    for batch in (1, 32, 128):
        call = gpu_minilm.raw_call(program, device, batch)
        for way in WAYS:
            timed(call, way, 10)
        runs = {way: [timed(call, way, calls) for _ in range(3)] for way in WAYS}
        print(f"batch {batch:3}: " + ", ".join(
            f"{way} {statistics.median(ms):.2f} ms" for way, ms in runs.items()), flush=True)
    stop = threading.Event()
    busy = threading.Thread(target=_spin, args=(stop,))
    busy.start()
    try:
        for batch in (1, 32):
            call = gpu_minilm.raw_call(program, device, batch)
            timed(call, "one", 3)
            print(f"batch {batch:3} beside a busy Python thread: one "
                  f"{timed(call, 'one', calls):.2f} ms, main {timed(call, 'main', calls):.2f} ms",
                  flush=True)
    finally:
        stop.set()
        busy.join()


def _spin(stop: threading.Event) -> None:
    count = 0
    while not stop.is_set():
        count += 1


if __name__ == "__main__":
    main()
