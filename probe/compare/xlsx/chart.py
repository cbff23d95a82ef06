"""Line charts of the .xlsx writer: DrawingML chart parts, the drawing that places them on
a sheet, and their relationships."""
from __future__ import annotations

import zipfile
from dataclasses import dataclass

from .cells import col_letter, esc


@dataclass
class LineChart:
    """A DrawingML line chart of columns of some sheet (blank cells are gaps).

    ``series``: (name, sheet name, column index, first row, last row), rows 1-based;
    ``anchor``: (first column, first row, last column, last row), 0-based cells it covers.
    """
    title: str
    categories: tuple               # (sheet name, column index, first row, last row)
    series: list
    anchor: tuple = (3, 1, 17, 28)
    x_title: str = ""
    y_title: str = ""
    log_y: bool = False


_NS_C = "http://schemas.openxmlformats.org/drawingml/2006/chart"
_NS_A = "http://schemas.openxmlformats.org/drawingml/2006/main"
_NS_R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_COLORS = ["C00000", "2E75B6", "70AD47", "7F6000"]


def _ref(sheet: str, col: int, r1: int, r2: int | None = None) -> str:
    c = col_letter(col)
    name = "'" + esc(sheet).replace("'", "''") + "'"
    return f"{name}!${c}${r1}" + (f":${c}${r2}" if r2 is not None else "")


def _rich(text: str) -> str:
    return (f'<c:title><c:tx><c:rich><a:bodyPr/><a:p><a:r><a:t>{esc(text)}</a:t></a:r></a:p>'
            f'</c:rich></c:tx><c:overlay val="0"/></c:title>')


def chart_xml(ch: LineChart) -> str:
    cs, cc, c1, c2 = ch.categories
    sers = []
    for k, (name, sh, col, r1, r2) in enumerate(ch.series):
        color = _COLORS[k % len(_COLORS)]
        sers.append(
            f'<c:ser><c:idx val="{k}"/><c:order val="{k}"/>'
            f'<c:tx><c:v>{esc(name)}</c:v></c:tx>'
            f'<c:spPr><a:ln w="15875"><a:solidFill><a:srgbClr val="{color}"/></a:solidFill></a:ln></c:spPr>'
            f'<c:marker><c:symbol val="circle"/><c:size val="3"/>'
            f'<c:spPr><a:solidFill><a:srgbClr val="{color}"/></a:solidFill></c:spPr></c:marker>'
            f'<c:cat><c:numRef><c:f>{_ref(cs, cc, c1, c2)}</c:f></c:numRef></c:cat>'
            f'<c:val><c:numRef><c:f>{_ref(sh, col, r1, r2)}</c:f></c:numRef></c:val>'
            f'<c:smooth val="0"/></c:ser>')
    log = '<c:logBase val="10"/>' if ch.log_y else ""
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            f'<c:chartSpace xmlns:c="{_NS_C}" xmlns:a="{_NS_A}" xmlns:r="{_NS_R}">'
            f'<c:chart>{_rich(ch.title)}<c:autoTitleDeleted val="0"/><c:plotArea><c:layout/>'
            '<c:lineChart><c:grouping val="standard"/><c:varyColors val="0"/>' + "".join(sers)
            + '<c:marker val="1"/><c:axId val="500000001"/><c:axId val="500000002"/></c:lineChart>'
            '<c:catAx><c:axId val="500000001"/><c:scaling><c:orientation val="minMax"/></c:scaling>'
            '<c:delete val="0"/><c:axPos val="b"/>' + (_rich(ch.x_title) if ch.x_title else "")
            + '<c:numFmt formatCode="General" sourceLinked="1"/><c:tickLblPos val="low"/>'
            '<c:crossAx val="500000002"/><c:crosses val="autoZero"/><c:auto val="1"/>'
            '<c:lblAlgn val="ctr"/><c:lblOffset val="100"/><c:noMultiLvlLbl val="0"/></c:catAx>'
            f'<c:valAx><c:axId val="500000002"/><c:scaling>{log}<c:orientation val="minMax"/></c:scaling>'
            '<c:delete val="0"/><c:axPos val="l"/><c:majorGridlines/>'
            + (_rich(ch.y_title) if ch.y_title else "")
            + '<c:numFmt formatCode="0.0E+0" sourceLinked="0"/><c:tickLblPos val="low"/>'
            '<c:crossAx val="500000001"/><c:crosses val="autoZero"/><c:crossBetween val="between"/>'
            '</c:valAx></c:plotArea><c:legend><c:legendPos val="b"/><c:overlay val="0"/></c:legend>'
            '<c:plotVisOnly val="1"/><c:dispBlanksAs val="gap"/></c:chart></c:chartSpace>')


def drawing_xml(charts: list, first_rid: int = 1) -> str:
    anchors = []
    for k, ch in enumerate(charts):
        c1, r1, c2, r2 = ch.anchor
        anchors.append(
            f'<xdr:twoCellAnchor><xdr:from><xdr:col>{c1}</xdr:col><xdr:colOff>0</xdr:colOff>'
            f'<xdr:row>{r1}</xdr:row><xdr:rowOff>0</xdr:rowOff></xdr:from>'
            f'<xdr:to><xdr:col>{c2}</xdr:col><xdr:colOff>0</xdr:colOff><xdr:row>{r2}</xdr:row>'
            f'<xdr:rowOff>0</xdr:rowOff></xdr:to><xdr:graphicFrame macro="">'
            f'<xdr:nvGraphicFramePr><xdr:cNvPr id="{k + 2}" name="Chart {k + 1}"/><xdr:cNvGraphicFramePr/>'
            f'</xdr:nvGraphicFramePr><xdr:xfrm><a:off x="0" y="0"/><a:ext cx="0" cy="0"/></xdr:xfrm>'
            f'<a:graphic><a:graphicData uri="{_NS_C}"><c:chart xmlns:c="{_NS_C}" r:id="rId{first_rid + k}"/>'
            f'</a:graphicData></a:graphic></xdr:graphicFrame><xdr:clientData/></xdr:twoCellAnchor>')
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            '<xdr:wsDr xmlns:xdr="http://schemas.openxmlformats.org/drawingml/2006/spreadsheetDrawing" '
            f'xmlns:a="{_NS_A}" xmlns:r="{_NS_R}">' + "".join(anchors) + "</xdr:wsDr>")


def rels(targets: list) -> str:
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            + "".join(f'<Relationship Id="rId{k + 1}" Type="{_NS_R}/{kind}" Target="{target}"/>'
                      for k, (kind, target) in enumerate(targets)) + "</Relationships>")


def write_charts(zf: zipfile.ZipFile, sheets: list) -> list:
    """Drawing + chart parts for sheets with charts; returns their content-type overrides."""
    overrides, n_chart, n_drawing = [], 0, 0
    for i, sheet in enumerate(sheets):
        if not sheet.charts:
            continue
        n_drawing += 1
        targets = []
        for ch in sheet.charts:
            n_chart += 1
            zf.writestr(f"xl/charts/chart{n_chart}.xml", chart_xml(ch))
            overrides.append((f"/xl/charts/chart{n_chart}.xml",
                              "application/vnd.openxmlformats-officedocument.drawingml.chart+xml"))
            targets.append(("chart", f"../charts/chart{n_chart}.xml"))
        zf.writestr(f"xl/drawings/drawing{n_drawing}.xml", drawing_xml(sheet.charts))
        zf.writestr(f"xl/drawings/_rels/drawing{n_drawing}.xml.rels", rels(targets))
        zf.writestr(f"xl/worksheets/_rels/sheet{i + 1}.xml.rels",
                    rels([("drawing", f"../drawings/drawing{n_drawing}.xml")]))
        overrides.append((f"/xl/drawings/drawing{n_drawing}.xml",
                          "application/vnd.openxmlformats-officedocument.drawing+xml"))
    return overrides
