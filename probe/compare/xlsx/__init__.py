"""The hand-written .xlsx writer (about 7x faster than XlsxWriter or openpyxl on a
100k-entry compare): cells (value encoding), sheets (sheet and workbook parts), chart."""
from .cells import SharedStrings, cell_body, csv_field, encode_column
from .chart import LineChart
from .sheets import ROW_STYLES, Sheet, write_workbook

__all__ = ["SharedStrings", "cell_body", "csv_field", "encode_column", "LineChart", "ROW_STYLES",
           "Sheet", "write_workbook"]
