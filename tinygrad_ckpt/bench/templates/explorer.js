// The memory explorer's glue (bench/explorer.py): hand the figures to Plotly, switch strategy and overlay,
// link listing and timeline.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("explorer-data").textContent);
  // Nothing on the mode bar sends anything off this machine: plotly.js 4 shows a 'Share chart...' button
  // (sendChartToCloud, on by default: showSendToCloud) that uploads the chart to plotlyServerURL.
  var config = {responsive: true, displaylogo: false, showSendToCloud: false, plotlyServerURL: "",
                modeBarButtonsToRemove: ["lasso2d", "select2d", "sendChartToCloud"]};
  data.charts.forEach(function (c) { Plotly.newPlot(c.id, c.figure.data, c.figure.layout, config); });
  data.timelines.forEach(setUp);

  function setUp(section) {
    var root = document.getElementById(section.id);
    var chart = root.querySelector(".timeline-chart");
    var pick = root.querySelector("select.strategy"), overlay = root.querySelector("select.overlay");
    var caption = root.querySelector(".selection");
    var state = {strategy: section.strategies[0], overlay: "", row: -1};

    function listing() { return root.querySelector(".listing[data-strategy='" + CSS.escape(state.strategy) + "']"); }

    function draw() {
      var step = section.steps[state.strategy];
      var traces = step.figure.data.slice();
      if (state.overlay && state.overlay !== state.strategy) {
        var other = section.steps[state.overlay], total = other.figure.data[other.figure.data.length - 1];
        traces.push({x: total.x, y: total.y, type: "scatter", mode: "lines", hoverinfo: "skip",
                     name: "total, " + state.overlay, line: {dash: "dash", width: 2, color: "#c0392b", shape: "hv"}});
      }
      var layout = Object.assign({}, step.figure.layout, {shapes: shapes()});
      return Plotly.react(chart, traces, layout, config);
    }

    function shapes() {  // the phase bands, and the selected record's span
      var step = section.steps[state.strategy], all = (step.figure.layout.shapes || []).slice();
      if (state.row >= 0) {
        var span = step.rows[state.row];
        all.push({type: "rect", name: "selected record", xref: "x", yref: "paper", x0: span[0], x1: span[1] + 1,
                  y0: 0, y1: 1, layer: "above", fillcolor: "rgba(255, 221, 87, 0.10)", line: {color: "#b8860b", width: 2.5}});
      }
      return all;
    }

    function select(row, scroll) {
      var table = listing();
      table.querySelectorAll("tr.selected").forEach(function (tr) { tr.classList.remove("selected"); });
      state.row = row;
      if (row >= 0) {
        var tr = table.querySelector("tr[data-row='" + row + "']");
        tr.classList.add("selected");
        if (scroll) { tr.scrollIntoView({block: "nearest"}); }
        var span = section.steps[state.strategy].rows[row], cells = tr.querySelectorAll("td");
        caption.textContent = "#" + cells[0].textContent + " " + cells[1].textContent + ": kept its saved arrays from event "
          + span[0] + " to event " + span[1] + " (" + cells[3].textContent + ")";
      } else {
        caption.textContent = "Select a record to mark when it kept its saved arrays.";
      }
      return Plotly.relayout(chart, {shapes: shapes()});
    }

    root.querySelectorAll(".listing").forEach(function (table) {
      table.addEventListener("click", function (ev) {
        var tr = ev.target.closest("tr.record");
        if (tr) { select(Number(tr.dataset.row), false); }
      });
      table.addEventListener("keydown", function (ev) {
        var tr = ev.target.closest("tr.record");
        if (tr && (ev.key === "Enter" || ev.key === " ")) { ev.preventDefault(); select(Number(tr.dataset.row), false); }
      });
    });
    if (pick) {
      pick.addEventListener("change", function () {
        state.strategy = pick.value;
        root.querySelectorAll(".listing").forEach(function (t) { t.hidden = t.dataset.strategy !== state.strategy; });
        state.row = -1;
        caption.textContent = "Select a record to mark when it kept its saved arrays.";
        draw();
      });
    }
    if (overlay) { overlay.addEventListener("change", function () { state.overlay = overlay.value; draw(); }); }
    draw().then(function () {
      chart.on("plotly_click", function (ev) {
        var point = ev.points[0];
        if (!point) { return; }
        var row = section.steps[state.strategy].event_rows[Math.round(point.x)];
        if (row >= 0) { select(row, true); }
      });
    });
  }
})();
