# SPDX-License-Identifier: Apache-2.0
# Run in every python context's kernel at start (hutch-interp passes it as
# IPKernelApp.exec_files): the extra result formats @e2b/code-interpreter
# reads (docs/interpreter.md "The wire (port 49999)", results). Nothing heavy is imported here:
# the formatters are registered by type name, so pandas and matplotlib
# load only when the cell uses them.
def _hutch_setup():
    import datetime
    import json as _json
    import os
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName

    ip = get_ipython()
    if ip is None:
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals()
                    else os.environ.get("HUTCH_INTERP_DIR", ""))

    class _Fmt(BaseFormatter):
        print_method = ObjectName("_repr_hutch_never_")
        _return_type = (dict, list)

    def add(mime):
        f = _Fmt(parent=ip.display_formatter)
        f.format_type = mime
        ip.display_formatter.formatters[mime] = f
        return f

    def jsonable(v):
        if isinstance(v, (datetime.datetime, datetime.date)):
            return v.isoformat()
        try:
            import numpy as np
            if isinstance(v, np.generic):
                return v.item()
            if isinstance(v, np.ndarray):
                return v.tolist()
        except ImportError:
            pass
        if hasattr(v, "isoformat"):
            return v.isoformat()
        return str(v)

    # e2b/data: a DataFrame as {column: [values]}
    data = add("e2b/data")

    def frame(df):
        try:
            d = df.to_dict(orient="list")
            return _json.loads(_json.dumps({str(k): v for k, v in d.items()}, default=jsonable, allow_nan=False))
        except (ValueError, TypeError):
            return None

    data.for_type_by_name("pandas.core.frame", "DataFrame", frame)

    # e2b/chart: what a matplotlib figure draws (e2b_charts.py)
    chart = add("e2b/chart")

    def figure(fig):
        try:
            import e2b_charts
            return e2b_charts.chart_of_figure(fig)
        except Exception:  # a chart we cannot read degrades to the png alone
            return None

    chart.for_type_by_name("matplotlib.figure", "Figure", figure)

    # application/json for dicts and lists, numpy-aware
    js = ip.display_formatter.formatters["application/json"]

    def as_json(v):
        try:
            return _json.loads(_json.dumps(v, default=jsonable, allow_nan=False))
        except (ValueError, TypeError):
            return None

    js.for_type(dict, as_json)
    js.for_type(list, as_json)

    # PIL: Image.save() also shows the image, as E2B's template does
    def pil_hook():
        try:
            from PIL import Image
        except ImportError:
            return
        if getattr(Image.Image.save, "_hutch", False):
            return
        orig = Image.Image.save

        def save(self, fp, *a, **kw):
            r = orig(self, fp, *a, **kw)
            # a save to a file shows the image (not one into a buffer:
            # matplotlib and _repr_png_ save through here)
            if isinstance(fp, (str, os.PathLike)):
                try:
                    from IPython.display import display
                    display(self)
                except Exception:
                    pass
            return r
        save._hutch = True
        Image.Image.save = save

    def post_run(*_):
        if "PIL.Image" in sys.modules:
            pil_hook()

    ip.events.register("pre_run_cell", lambda *a: post_run())

    # A result's large strings (a PNG's base64, an SVG, HTML) leave as
    # ZeroMQ buffers after the message's frames instead of inside its JSON:
    # Python's json spent about 20 ms on a 1 MB PNG's 1.4 MB string, and
    # hutch-interp parsed and re-escaped it. The content names them
    # ({"hutch_buffers": {mime: index}}) and hutch-interp writes each into
    # the E2B result line once (interp/jresult.c). The message, its order
    # among the others and every other key are what ipykernel sends.
    session = getattr(getattr(ip, "kernel", None), "session", None)
    if session is not None and not getattr(session.send, "_hutch", False):
        send = session.send
        results = ("display_data", "update_display_data", "execute_result")
        big = 64 << 10

        def send_results_with_buffers(stream, msg_or_type, *a, **kw):
            msg = msg_or_type
            if not (isinstance(msg, dict) and not a and not kw.get("buffers") and not msg.get("buffers")
                    and msg.get("msg_type") in results):
                return send(stream, msg_or_type, *a, **kw)
            content = msg.get("content")
            data = content.get("data") if isinstance(content, dict) else None
            if not isinstance(data, dict):
                return send(stream, msg, **kw)
            bufs, where, rest = [], {}, None
            for k, v in data.items():
                if isinstance(k, str) and isinstance(v, str) and len(v) >= big:
                    try:
                        b = v.encode("utf-8")
                    except UnicodeEncodeError:  # a lone surrogate: as ipykernel would
                        continue
                    if rest is None:
                        rest = dict(data)
                    del rest[k]
                    where[k] = len(bufs)
                    bufs.append(b)
            if not bufs:
                return send(stream, msg, **kw)
            msg = dict(msg)
            msg["content"] = dict(content, data=rest, hutch_buffers=where)
            return send(stream, msg, buffers=bufs, **kw)

        send_results_with_buffers._hutch = True
        session.send = send_results_with_buffers


_hutch_setup()
del _hutch_setup
