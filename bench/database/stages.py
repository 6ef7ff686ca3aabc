"""Each stage's seconds of a database job, from the coordinator's log on stdin: from its
"job progress stage=" line to the next stage's (the last to the log's last line); then
what raking did, from its "raked:" line."""

import datetime
import re
import sys


def when(line):
    return datetime.datetime.fromisoformat(line.split()[0].rstrip("Z")[:26])


lines = [(when(l), l) for l in sys.stdin if l[:4].isdigit()]
marks = [(t, re.search(r'stage="([^"]*)"', l).group(1)) for t, l in lines if "stage=" in l]
marks.append((lines[-1][0], "end"))
stages = []
for (a, name), (b, _) in zip(marks, marks[1:]):
    name = name.split(":")[0][:40]
    if stages and stages[-1][0] == name:
        stages[-1][1] += (b - a).total_seconds()
    else:
        stages.append([name, (b - a).total_seconds()])
print("; ".join(f"{name}: {seconds:.1f} s" for name, seconds in stages))
for _, line in lines:
    if "raked:" in line:
        f = dict(re.findall(r"(\w+)=([0-9.e+-]+)", line))
        said = [f"gap {float(f['before']):.4f} -> {float(f['after']):.4f}"]
        said += [f"(chance {float(f['chance']):.4f}), {f['tilts']} tilts, {float(f['seconds']):.1f} s"] if "tilts" in f else []
        print("raking: " + " ".join(said))
