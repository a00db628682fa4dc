"""A stand-in for `cutecc.tuning.bench` with scripted behaviour, for tests/commands/test_tune.py: it
speaks the child's protocol without a GPU. threads=64 raises (a `fault` event, exit 3),
threads=512 kills its process with no word (as a hard crash would), threads=1024 disagrees
with the default; the default and threads=128 get times. $FAKE_BENCH_HANG names a variant
suffix that hangs instead (as a deadlocked kernel would); $FAKE_BENCH_HANG_TIMING names a
bucket whose timing hangs (after `checked`); $FAKE_BENCH_SLOW is seconds each bucket's timing
takes (a healthy, slow run); $FAKE_BENCH_CHATTY names a bucket whose timing hangs while a
library keeps printing; $FAKE_BENCH_LINGER closes standard output and lingers after its
first bucket. Lines that are not events (a library's print) are mixed in."""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> None:
    job = json.loads(sys.stdin.read())
    item, exclude = job["item"], set(job["exclude"])
    print(json.dumps({"event": "device", "device": "Fake GPU", "driver": "none"}), flush=True)
    names = [b["extent"] for b in item["buckets"]]
    for bucket in job["buckets"]:
        text = ",".join(f"{n}={bucket[n]}" for n in names)
        times, dropped = {}, {}
        for c in item["candidates"]:
            if c["key"] in exclude:
                continue
            print(json.dumps({"event": "start", "key": c["key"], "bucket": text}), flush=True)
            v = c["variant"]
            if os.environ.get("FAKE_BENCH_HANG") and v.endswith(os.environ["FAKE_BENCH_HANG"]):
                time.sleep(3600)
            if v.endswith("threads=64"):
                print(json.dumps({"event": "fault", "key": c["key"], "bucket": text,
                                  "error": "XlaRuntimeError: an illegal memory access"}), flush=True)
                os._exit(3)
            if v.endswith("threads=512"):
                os.kill(os.getpid(), signal.SIGKILL)
            if v.endswith("threads=1024"):
                dropped[c["key"]] = "disagrees with the default configuration"
            else:
                times[c["key"]] = [1.0, 2.0, 2.1] if c["default"] else [0.9, 1.0, 1.1]
        print(json.dumps({"event": "checked", "bucket": text}), flush=True)
        print("a library's chatter on standard output", flush=True)
        if os.environ.get("FAKE_BENCH_HANG_TIMING") == text:
            time.sleep(3600)
        while os.environ.get("FAKE_BENCH_CHATTY") == text:
            print("still compiling...", flush=True)
            time.sleep(0.2)
        time.sleep(float(os.environ.get("FAKE_BENCH_SLOW", "0")))
        print(json.dumps({"event": "bucket", "bucket": text, "k": 4, "times": times, "dropped": dropped}),
              flush=True)
        if os.environ.get("FAKE_BENCH_LINGER"):
            sys.stdout.close()
            os.close(1)
            time.sleep(3600)


if __name__ == "__main__":
    main()
