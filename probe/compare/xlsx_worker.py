"""The worker process of a big sheet's encoding (started by xlsx._Chunks, which runs
``main()`` in a fresh interpreter).

stdin, pickled by the parent that started this process: the sheet's encoding state
(``_Rows.state()``), then chunks of rows (``_Rows.chunk()``), then EOF.  stdout, per
chunk: a 24-byte header (first row, XML length or -1 if encoding failed, CSV length) and
the bytes.  The parent encodes a failed chunk itself, so its error surfaces there.
"""
import gc
import pickle
import sys

from .xlsx import _FRAME, encode_rows


def main() -> None:
    gc.disable()            # every chunk unpickles ~100k objects and makes no cycles
    src, out = sys.stdin.buffer, sys.stdout.buffer
    try:
        prefixes, shared, with_csv = pickle.load(src)
        while True:
            columns, styles, lo = pickle.load(src)
            try:
                xml, text = encode_rows(columns, styles, lo, prefixes, shared, with_csv)
            except Exception:
                out.write(_FRAME.pack(lo, -1, 0))
            else:
                out.write(_FRAME.pack(lo, len(xml), len(text)) + xml + text)
            out.flush()
    except (EOFError, BrokenPipeError):
        pass


if __name__ == "__main__":
    main()
