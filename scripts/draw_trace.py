#!/usr/bin/python3
"""Render a loom Chrome/Perfetto trace (JSON) into a PNG timeline for docs.

Usage:
  draw_trace.py TRACE.json -o OUT.png [--title TEXT] [--step N]
                [--from-ms A --to-ms B] [--width-px 1800] [--dpi 120]

One horizontal lane per (rank, lane) pair -- pid is the rank, tid the lane
(0 compute, 1 communication, ...) -- ranks top to bottom, lanes in tid order.
Each complete ("ph":"X") event is a bar from ts to ts+dur, coloured by its
"cat"; names are written inside bars only where they fit.  The time axis is
in milliseconds from the earliest event kept after --step; --from-ms/--to-ms
select a window on that same axis, so the tick numbers match what was asked.
Typical use, one training step:  draw_trace.py trace.json -o step3.png --step 3

Bad input is reported as one line on stderr with exit status 1.
Needs matplotlib for /usr/bin/python3: sudo apt-get install python3-matplotlib
"""
import argparse
import json
import math
import os
import sys

PROG = "draw_trace.py"

# Fixed colours so a category looks the same in every picture: compute in
# strong tab10 tones, collectives cyan/purple/pink, point-to-point
# olive/indigo, recomputation amber, waiting in greys (light enough to read as
# "nothing useful").
CATEGORY_COLOURS = {
    "forward": "#1f77b4", "backward": "#ff7f0e",
    "backward_input": "#d62728", "backward_weight": "#8c564b",
    "optimizer": "#2ca02c", "all_reduce": "#17becf",
    "reduce_scatter": "#9467bd", "all_gather": "#e377c2",
    "send": "#bcbd22", "recv": "#393b79",
    "wait": "#a8a8a8", "idle": "#d9d9d9",
    "recompute": "#e6a817",
}
# Light tab20 tones for categories loom may add later; distinct from above.
FALLBACK_COLOURS = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
                    "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#7f7f7f"]
LABEL_PT = 7.0   # font size of names inside bars


class Fail(Exception):
    """A user-facing error: printed as one line, exit status 1."""


class Parser(argparse.ArgumentParser):
    # argparse prints usage plus message and exits 2; we promise one line, 1.
    def error(self, message):
        raise Fail(message)


def parse_args(argv):
    p = Parser(prog=PROG, description="Render a loom trace JSON into a PNG timeline.")
    p.add_argument("trace", help="Chrome/Perfetto trace JSON written by loom")
    p.add_argument("-o", "--output", required=True, metavar="OUT.png", help="PNG file to write")
    p.add_argument("--title", metavar="TEXT", help="default: input file name")
    p.add_argument("--step", type=int, metavar="N", help="keep only events with args.step == N")
    p.add_argument("--from-ms", type=float, metavar="A", help="window start (ms from first event)")
    p.add_argument("--to-ms", type=float, metavar="B", help="window end (ms from first event)")
    p.add_argument("--width-px", type=int, default=1800, metavar="PX", help="default 1800")
    p.add_argument("--dpi", type=int, default=120, metavar="DPI", help="default 120")
    a = p.parse_args(argv)
    if not 300 <= a.width_px <= 20000:
        raise Fail(f"--width-px must be between 300 and 20000, got {a.width_px}")
    if not 30 <= a.dpi <= 600:
        raise Fail(f"--dpi must be between 30 and 600, got {a.dpi}")
    for name in ("from_ms", "to_ms"):
        v = getattr(a, name)
        if v is not None and not math.isfinite(v):
            raise Fail(f"--{name.replace('_', '-')} must be a finite number, got {v}")
    if a.from_ms is not None and a.to_ms is not None and a.to_ms <= a.from_ms:
        raise Fail(f"--to-ms ({a.to_ms:g}) must be greater than --from-ms ({a.from_ms:g})")
    return a


def number(v):
    # bool is an int in Python; a JSON true is not a timestamp.
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def sort_key(v):
    # pid/tid are ints in loom but may be strings in other Chrome traces.
    return (0, v, "") if number(v) else (1, 0, str(v))


def load(path):
    """Return (X events as dicts, process names, thread names)."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise Fail(f"no such file: {path}")
    except (OSError, UnicodeDecodeError) as e:
        raise Fail(f"cannot read {path}: {e}")
    except (ValueError, RecursionError) as e:
        raise Fail(f"{path} is not valid JSON: {str(e).splitlines()[0]}")
    # Chrome accepts both {"traceEvents": [...]} and a bare [...] array.
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise Fail(f"{path} has no traceEvents list")
    procs, threads, xs = {}, {}, []
    for e in events:
        if not isinstance(e, dict):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        pid, tid = e.get("pid", 0), e.get("tid", 0)
        if e.get("ph") == "M" and isinstance(args.get("name"), str):
            if e.get("name") == "process_name":
                procs[pid] = args["name"]
            elif e.get("name") == "thread_name":
                threads[(pid, tid)] = args["name"]
        elif e.get("ph") == "X" and number(e.get("ts")) and number(e.get("dur")) \
                and e["dur"] >= 0 and isinstance(pid, (int, float, str)) \
                and isinstance(tid, (int, float, str)):
            step = args.get("step")
            xs.append({"pid": pid, "tid": tid, "ts": float(e["ts"]), "dur": float(e["dur"]),
                       "name": str(e.get("name", "")), "cat": str(e.get("cat") or "other"),
                       "step": step if number(step) else None})
    if not xs:
        raise Fail(f"{path} has no complete ('ph':'X') events with numeric ts and dur")
    return xs, procs, threads


def select(xs, a):
    """Apply --step and the window; return (events, x-axis range in ms, origin µs)."""
    if a.step is not None:
        kept = [e for e in xs if e["step"] == a.step]
        if not kept:
            steps = sorted({int(e["step"]) if e["step"] == int(e["step"]) else e["step"]
                            for e in xs if e["step"] is not None})
            present = ", ".join(map(str, steps)) if steps else "none (no event has args.step)"
            raise Fail(f"no event has step {a.step}; steps present: {present}")
        xs = kept
    t0 = min(e["ts"] for e in xs)
    end = max((e["ts"] + e["dur"] - t0) / 1000.0 for e in xs)
    if a.from_ms is not None and a.from_ms >= end:
        raise Fail(f"--from-ms {a.from_ms:g} is not before the end of the events ({end:g} ms)")
    if a.to_ms is not None and a.to_ms <= 0:
        raise Fail(f"--to-ms {a.to_ms:g} is not after the first event (0 ms)")
    lo = a.from_ms if a.from_ms is not None else 0.0
    # A little room after the last event so it does not merge into the frame
    # (and a non-empty axis when every event has zero duration).
    hi = a.to_ms if a.to_ms is not None else end + max(0.01 * (end - lo), 1e-3)
    # Keep anything overlapping the window; the axes clip the overhang.
    xs = [e for e in xs if (e["ts"] - t0) / 1000.0 <= hi
          and (e["ts"] + e["dur"] - t0) / 1000.0 >= lo]
    if not xs:
        raise Fail(f"no events between {lo:g} and {hi:g} ms (events span 0..{end:g} ms)")
    return xs, (lo, hi), t0


def colour_map(cats):
    order = [c for c in CATEGORY_COLOURS if c in cats] + sorted(cats - CATEGORY_COLOURS.keys())
    extra = iter(FALLBACK_COLOURS * (1 + len(order) // len(FALLBACK_COLOURS)))
    return {c: CATEGORY_COLOURS.get(c) or next(extra) for c in order}


def text_colour(hex_colour):
    # Black on light bars, white on dark ones (relative luminance).
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def draw(xs, procs, threads, window, t0, a):
    import matplotlib
    matplotlib.use("Agg")   # no display needed; also the fastest backend
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = sorted({(e["pid"], e["tid"]) for e in xs},
                   key=lambda k: (sort_key(k[0]), sort_key(k[1])))
    row = {k: i for i, k in enumerate(lanes)}
    colours = colour_map({e["cat"] for e in xs})
    lo, hi = window

    # Height grows with lanes; shrink rows a little for very many lanes so
    # the picture stays under matplotlib's size limits.
    lane_in = 0.42 if len(lanes) <= 100 else max(0.12, 42.0 / len(lanes))
    fig_w = a.width_px / a.dpi
    fig_h = 1.6 + lane_in * len(lanes) + 0.22 * math.ceil(len(colours) / max(2, a.width_px // 220))
    fig, ax = plt.subplots(figsize=(fig_w, fig_h), dpi=a.dpi, facecolor="white")

    # One broken_barh (a single PolyCollection) per lane and category keeps
    # 100k events fast; thin white edges separate back-to-back events, but
    # only when there are few enough that edges do not paint over the bars.
    # A bar under a pixel or two would vanish; widen it so short events
    # (tiny sends, waits) stay visible.
    edge = 0.4 if len(xs) <= 5000 else 0.0
    min_w = (hi - lo) / a.width_px * (3.0 if edge else 1.0)
    groups = {}
    for e in xs:
        groups.setdefault((row[(e["pid"], e["tid"])], e["cat"]), []).append(
            ((e["ts"] - t0) / 1000.0, max(e["dur"] / 1000.0, min_w)))
    for (r, cat), spans in groups.items():
        ax.broken_barh(spans, (r - 0.4, 0.8), facecolors=colours[cat],
                       edgecolor="white", linewidth=edge)

    # loom names processes "rank N" and threads "compute"/"communication".
    ax.set_yticks(range(len(lanes)), [procs.get(p, f"rank {p}") + " "
                                      + threads.get((p, t), f"lane {t}") for p, t in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)   # first rank at the top
    for i in range(1, len(lanes)):        # rule between ranks
        if lanes[i][0] != lanes[i - 1][0]:
            ax.axhline(i - 0.5, color="#555555", linewidth=0.8)
    ax.set_xlim(lo, hi)
    what = f"step {a.step}" if a.step is not None else "the trace"
    ax.set_xlabel(f"time (ms) from the first event of {what}")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_title(a.title if a.title is not None else os.path.basename(a.trace))
    # The legend goes in a strip reserved at the bottom of the figure, so
    # its place does not depend on how tall the axes turn out.
    per_row = max(2, a.width_px // 220)
    rows = math.ceil(len(colours) / per_row)
    fig.legend(handles=[Patch(facecolor=c, edgecolor="#888888", label=k)
                        for k, c in colours.items()],
               loc="lower center", ncol=math.ceil(len(colours) / rows), frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, (0.22 * rows + 0.08) / fig_h, 1, 1))

    # Measure the real plot width after layout to get pixels per ms, then
    # write a name only where its estimated width (~0.6 em per character)
    # fits inside the visible part of its bar.
    px_per_ms = ax.get_window_extent().width / (hi - lo)
    char_px = 0.6 * LABEL_PT * a.dpi / 72.0
    for e in xs:
        s = max((e["ts"] - t0) / 1000.0, lo)
        t = min((e["ts"] + e["dur"] - t0) / 1000.0, hi)
        if not e["name"] or (t - s) * px_per_ms < len(e["name"]) * char_px + 4:
            continue
        ax.text((s + t) / 2, row[(e["pid"], e["tid"])], e["name"], ha="center",
                va="center", fontsize=LABEL_PT, color=text_colour(colours[e["cat"]]),
                clip_on=True)
    try:
        fig.savefig(a.output, format="png", dpi=a.dpi, facecolor="white")
    except OSError as e:
        raise Fail(f"cannot write {a.output}: {e.strerror or e}")
    finally:
        plt.close(fig)


def main(argv):
    try:
        a = parse_args(argv)
        try:
            import matplotlib  # noqa: F401  (checked before any work is done)
        except ImportError:
            print(f"{PROG} needs matplotlib: sudo apt-get install python3-matplotlib",
                  file=sys.stderr)
            return 1
        xs, procs, threads = load(a.trace)
        xs, window, t0 = select(xs, a)
        draw(xs, procs, threads, window, t0, a)
    except Fail as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug or an input we did not foresee: still one line
        first = (str(e).splitlines() or [""])[0]
        print(f"{PROG}: unexpected error: {type(e).__name__}: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
