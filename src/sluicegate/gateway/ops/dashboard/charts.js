// Small line charts drawn as inline SVG: no library, no canvas, crisp at any zoom.

const SVG = "http://www.w3.org/2000/svg";
export const LANE_COLORS = ["#2563eb", "#d97706", "#7c3aed", "#0d9488", "#db2777", "#65a30d"];

function node(tag, attrs, text) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) element.setAttribute(name, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

// A round upper bound for an axis, at least `floor`: 1, 2, 4, 6 or 8 times a power of ten
// (so that its half, the middle grid line, is round too).
function niceMax(value, floor) {
  const top = Math.max(value, floor);
  const power = 10 ** Math.floor(Math.log10(top));
  for (const step of [1, 2, 4, 6, 8, 10]) if (step * power >= top * (1 - 1e-9)) return step * power;
  return 10 * power;
}

const spanLabel = (seconds) => (seconds < 120 ? `-${Math.round(seconds)} s` : `-${Math.round(seconds / 60)} min`);

// An SVG chart of `series` ([{name, color, dashed, points: [[t, value|null], ...]}]) over
// the window [now - spanS, now]; `format` labels the axis maximum.
export function lineChart({ title, series, now, spanS, format, minMax = 1 }) {
  const width = 420;
  const height = 118;
  const left = 44;
  const right = 8;
  const top = 20;
  const bottom = 16;
  const plotW = width - left - right;
  const plotH = height - top - bottom;
  let highest = 0;
  for (const one of series) {
    for (const [, value] of one.points) if (value !== null) highest = Math.max(highest, value);
  }
  const yMax = niceMax(highest, minMax);
  const x = (t) => left + plotW * (1 - (now - t) / spanS);
  const y = (value) => top + plotH * (1 - value / yMax);

  const svg = node("svg", {
    viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": title,
  });
  svg.append(node("text", { x: left, y: 13, class: "chart-title" }, title));
  for (const fraction of [0, 0.5, 1]) {
    const lineY = top + plotH * (1 - fraction);
    svg.append(node("line", { x1: left, x2: width - right, y1: lineY, y2: lineY, class: "grid" }));
    svg.append(
      node("text", { x: left - 5, y: lineY + 3.5, class: "axis", "text-anchor": "end" },
        format(yMax * fraction)),
    );
  }
  svg.append(node("text", { x: left, y: height - 3, class: "axis" }, spanLabel(spanS)));
  svg.append(node("text", { x: width - right, y: height - 3, class: "axis", "text-anchor": "end" }, "now"));
  for (const one of series) {
    // A gap in the data (a failed poll, a missing field) breaks the line.
    let run = [];
    const flush = () => {
      if (run.length > 1) {
        svg.append(node("polyline", {
          points: run.join(" "), fill: "none", stroke: one.color, "stroke-width": 1.6,
          "stroke-linejoin": "round", "stroke-dasharray": one.dashed ? "4 3" : "none",
        }));
      } else if (run.length === 1) {
        const [cx, cy] = run[0].split(",");
        svg.append(node("circle", { cx, cy, r: 1.6, fill: one.color }));
      }
      run = [];
    };
    for (const [t, value] of one.points) {
      if (value === null || t < now - spanS) flush();
      else run.push(`${x(t).toFixed(1)},${y(value).toFixed(1)}`);
    }
    flush();
  }
  return svg;
}
