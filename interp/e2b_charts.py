# SPDX-License-Identifier: Apache-2.0
# E2B's `chart` result: what a matplotlib figure draws, as data
# (docs/interpreter.md "The wire (port 49999)", charts). This project's own reading of the figure's
# artists; every key of a chart kind is present, null when unknown.
import datetime
import re

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _unit(label):
    if not label:
        return None
    m = _UNIT.search(label)
    if not m:
        return None
    return m.group(1) if m.group(1) is not None else m.group(2)


def _num(v):
    try:
        import numpy as np
        if isinstance(v, np.generic):
            v = v.item()
    except ImportError:
        pass
    if isinstance(v, (datetime.datetime, datetime.date)):
        return v.isoformat()
    if isinstance(v, (int, float)):
        return float(v)
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _is_date_axis(axis):
    try:
        from matplotlib.dates import DateConverter, _SwitchableDateConverter
        conv = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
        return isinstance(conv, (DateConverter, _SwitchableDateConverter))
    except ImportError:
        try:
            from matplotlib.dates import DateConverter
            conv = getattr(axis, "converter", None)
            return isinstance(conv, DateConverter)
        except ImportError:
            return False


def _ticks(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    locs = list(ax.get_xticks() if which == "x" else ax.get_yticks())
    labels = [t.get_text() for t in (ax.get_xticklabels() if which == "x" else ax.get_yticklabels())]
    if _is_date_axis(axis):
        from matplotlib.dates import num2date
        return [num2date(t).isoformat() for t in locs], labels, "datetime"
    scale = axis.get_scale()
    ticks = [float(t) for t in locs]
    if scale == "linear" and ticks and labels and len(labels) == len(ticks) and all(
            t == i for i, t in enumerate(ticks)) and any(lb != str(i) for i, lb in enumerate(labels)):
        scale = "categorical"
    return ticks, labels, scale


def _axis_keys(ax):
    xl, yl = ax.get_xlabel() or None, ax.get_ylabel() or None
    return {"x_label": xl, "y_label": yl, "x_unit": _unit(xl), "y_unit": _unit(yl)}


def _points(xs, ys, date_x):
    out = []
    for x, y in zip(xs, ys):
        if date_x:
            from matplotlib.dates import num2date
            try:
                x = num2date(float(x)).isoformat()
            except (TypeError, ValueError):
                x = _num(x)
        else:
            x = _num(x)
        out.append([x, _num(y)])
    return out


def _line_like(ax, kind):
    keys = _axis_keys(ax)
    xt, xtl, xs = _ticks(ax, "x")
    yt, ytl, ys = _ticks(ax, "y")
    keys.update({"x_ticks": xt, "x_tick_labels": xtl, "x_scale": xs,
                 "y_ticks": yt, "y_tick_labels": ytl, "y_scale": ys})
    date_x = xs == "datetime"
    elements = []
    if kind == "line":
        for i, line in enumerate(ax.get_lines()):
            label = line.get_label()
            if label.startswith("_child"):
                label = "Line " + label[len("_child"):]
            elements.append({"label": label, "points": _points(line.get_xdata(), line.get_ydata(), date_x)})
    else:
        for coll in ax.collections:
            offs = coll.get_offsets()
            label = coll.get_label()
            if label.startswith("_child"):
                label = "Scatter " + label[len("_child"):]
            elements.append({"label": label, "points": _points([o[0] for o in offs], [o[1] for o in offs], date_x)})
    return keys, elements


def _bar(ax):
    from matplotlib.patches import Rectangle
    keys = _axis_keys(ax)
    elements = []
    containers = list(getattr(ax, "containers", []))
    rects = [p for p in ax.patches if isinstance(p, Rectangle)]
    horizontal = False
    if rects:
        widths = {round(r.get_width(), 9) for r in rects}
        heights = {round(r.get_height(), 9) for r in rects}
        horizontal = len(heights) == 1 and len(widths) > 1
    if horizontal:
        keys = {"x_label": keys["y_label"], "y_label": keys["x_label"], "x_unit": keys["y_unit"], "y_unit": keys["x_unit"]}
    labels = [t.get_text() for t in (ax.get_yticklabels() if horizontal else ax.get_xticklabels())]
    locs = list(ax.get_yticks() if horizontal else ax.get_xticks())

    def label_at(pos):
        for loc, lb in zip(locs, labels):
            if abs(loc - pos) < 1e-6:
                return lb
        return _fmt(pos)

    groups = containers or [rects]
    for gi, cont in enumerate(groups):
        glabel = cont.get_label() if hasattr(cont, "get_label") else None
        if not glabel or glabel.startswith("_container"):
            glabel = "Group " + (glabel[len("_container"):] if glabel else str(gi))
        for r in cont:
            if horizontal:
                pos, value = r.get_y() + r.get_height() / 2, r.get_width()
            else:
                pos, value = r.get_x() + r.get_width() / 2, r.get_height()
            elements.append({"label": label_at(pos), "group": glabel, "value": float(value)})
    return keys, elements


def _round8(v):
    """A float kept to 8 significant digits less one per power of ten above
    the units (324 keeps 6, 36 keeps 7, 0.5 keeps 9): float noise such as
    323.99999999 becomes 324, as E2B's charts give it."""
    from decimal import Decimal, localcontext
    d = Decimal(str(float(v)))
    if not d.is_finite() or d == 0:
        return float(v)
    with localcontext() as ctx:
        ctx.prec = max(1, 8 - d.adjusted())
        return float(+d)


def _fmt(v):
    return str(int(v)) if float(v).is_integer() else str(v)


def _pie(ax):
    from matplotlib.patches import Wedge
    elements = []
    texts = [t for t in ax.texts]
    for i, w in enumerate(p for p in ax.patches if isinstance(p, Wedge)):
        label = w.get_label() or (texts[2 * i].get_text() if len(texts) > 2 * i else "")
        elements.append({"label": label, "angle": abs(_round8(float(w.theta2) - float(w.theta1))),
                         "radius": float(w.r)})
    return {}, elements


def _box(ax):
    from matplotlib.lines import Line2D
    keys = _axis_keys(ax)
    lines = [ln for ln in ax.get_lines()]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    locs = list(ax.get_xticks())
    # a boxplot draws, per box: 2 whiskers, 2 caps, 1 median, 1 fliers (and the box as a PathPatch)
    boxes = {}
    from matplotlib.patches import PathPatch
    for p in ax.patches:
        if isinstance(p, PathPatch):
            v = p.get_path().vertices
            x = round(float((v[:, 0].min() + v[:, 0].max()) / 2), 6)
            boxes.setdefault(x, {})["q"] = (float(v[:, 1].min()), float(v[:, 1].max()))
    rest = []
    for ln in lines:
        if _box_outline(ln):  # a box drawn as a line (boxplot without patch_artist)
            xd, yd = list(map(float, ln.get_xdata())), list(map(float, ln.get_ydata()))
            boxes.setdefault(round((min(xd) + max(xd)) / 2, 6), {})["q"] = (min(yd), max(yd))
        else:
            rest.append(ln)
    for ln in rest:
        xd, yd = list(map(float, ln.get_xdata())), list(map(float, ln.get_ydata()))
        if not xd:
            continue
        x = round(sum(xd) / len(xd), 6)
        b = min(boxes, key=lambda k: abs(k - x)) if boxes else x
        entry = boxes.setdefault(b, {})
        if ln.get_linestyle() in ("None", "none", "") and ln.get_marker() not in (None, "None", ""):
            entry["outliers"] = yd
        elif len(xd) == 2 and xd[0] == xd[1]:
            entry.setdefault("whiskers", []).extend(yd)
        elif len(yd) == 2 and yd[0] == yd[1]:
            entry.setdefault("flat", []).append(yd[0])
    elements = []
    for x in sorted(boxes):
        e = boxes[x]
        q1, q3 = e.get("q", (None, None))
        wh = e.get("whiskers", [])
        flat = e.get("flat", [])
        median = None
        for f in flat:
            if q1 is not None and q1 < f < q3:
                median = f
        if median is None and flat:
            median = sorted(flat)[len(flat) // 2]
        label = ""
        for loc, lb in zip(locs, labels):
            if abs(loc - x) < 0.5:
                label = lb
        elements.append({"label": label, "min": min(wh) if wh else q1, "first_quartile": q1, "median": median,
                         "third_quartile": q3, "max": max(wh) if wh else q3, "outliers": e.get("outliers", [])})
    return keys, elements


def _box_outline(ln):
    xd, yd = list(ln.get_xdata()), list(ln.get_ydata())
    return (len(xd) == 5 and xd[0] == xd[4] and yd[0] == yd[4] and len(set(map(float, xd))) == 2
            and len(set(map(float, yd))) == 2)


def _grid_line(ln):
    xd, yd = list(ln.get_xdata()), list(ln.get_ydata())
    return len(xd) == 2 and (xd[0] == xd[1] or yd[0] == yd[1])


def chart_of_axes(ax):
    from matplotlib.collections import Collection, PathCollection
    from matplotlib.image import AxesImage
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    children = [c for c in ax.get_children() if not isinstance(c, Text)]
    # the axes' own furniture: spines, background patch, axis objects
    own = set(ax.spines.values()) | {ax.patch, ax.xaxis, ax.yaxis}
    # what the user drew: lines, collections, images and any patch (a
    # Circle added with add_artist too: a chart of kind "unknown", with its
    # title and no elements, as E2B gives it)
    drawn = [c for c in children if c not in own and (isinstance(c, (Line2D, Collection, Patch, AxesImage))
                                                       or c in ax.collections)]
    title = ax.get_title() or None
    if not drawn:
        return None
    if all(isinstance(c, Line2D) for c in drawn) and not any(_box_outline(c) for c in drawn):
        kind = "line"
    elif all(isinstance(c, (PathPatch, Line2D)) for c in drawn):
        kind = "box_and_whisker"
    else:
        rest = [c for c in drawn if not (isinstance(c, Line2D) and _grid_line(c))]
        if rest and all(isinstance(c, PathCollection) for c in rest):
            kind = "scatter"
        elif rest and all(isinstance(c, Wedge) for c in rest):
            kind = "pie"
        elif rest and all(isinstance(c, Rectangle) for c in rest):
            kind = "bar"
        else:
            kind = "unknown"
    if kind in ("line", "scatter"):
        keys, elements = _line_like(ax, kind)
    elif kind == "bar":
        keys, elements = _bar(ax)
    elif kind == "pie":
        keys, elements = _pie(ax)
    elif kind == "box_and_whisker":
        keys, elements = _box(ax)
    else:
        keys, elements = {}, []
    out = {"type": kind, "title": title}
    out.update(keys)
    out["elements"] = elements
    return out


def chart_of_figure(fig):
    axes = fig.get_axes()
    if not axes:
        return None
    if len(axes) == 1:
        return chart_of_axes(axes[0])
    charts = [c for c in (chart_of_axes(a) for a in axes) if c]
    if not charts:
        return None
    sup = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
    return {"type": "superchart", "title": sup or None, "elements": charts}
