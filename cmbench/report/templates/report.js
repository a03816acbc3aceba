/* Sortable tables and gallery filters. No dependencies, no network. */
"use strict";

function sortTable(table, column, th) {
  const numeric = Array.from(table.tBodies[0].rows).every(
    (row) => row.cells[column].classList.contains("num"));
  const ascending = th.getAttribute("aria-sort") !== "ascending";
  const key = (row) => row.cells[column].dataset.sort;
  const rows = Array.from(table.tBodies[0].rows);
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === "" || y === "") return (x === "") - (y === "");  // empty (NaN) last either way
    const order = numeric ? Number(x) - Number(y) : x.localeCompare(y);
    return ascending ? order : -order;
  });
  for (const row of rows) table.tBodies[0].appendChild(row);
  for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
  th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
}

for (const table of document.querySelectorAll("table.sortable")) {
  Array.from(table.tHead.rows[0].cells).forEach((th, column) => {
    th.querySelector("button").addEventListener("click", () => sortTable(table, column, th));
  });
}

const REFERENCE = document.body.dataset.reference;

function applyFilters() {
  const source = document.getElementById("filter-source").value;
  const type = document.getElementById("filter-type").value;
  const method = document.getElementById("filter-method").value;
  const tasks = document.querySelectorAll("article.task");
  let shown = 0;
  for (const task of tasks) {
    const visible = (!source || task.dataset.source === source) && (!type || task.dataset.type === type);
    task.hidden = !visible;
    if (visible) shown += 1;
    for (const cell of task.querySelectorAll("figure.method")) {
      cell.hidden = Boolean(method) && cell.dataset.method !== method && cell.dataset.method !== REFERENCE;
    }
  }
  for (const panel of document.querySelectorAll("section.losses")) {
    panel.hidden = panel.dataset.method !== method;
  }
  document.getElementById("shown-count").textContent = shown + " of " + tasks.length + " tasks";
}

const FILTERS = { source: "filter-source", type: "filter-type", method: "filter-method" };

/* "#method=X&source=Y&type=Z" opens the gallery with those filters (leaderboard method names link there). */
function filtersFromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (!Object.keys(FILTERS).some((key) => params.has(key))) return false;
  for (const [key, id] of Object.entries(FILTERS)) {
    const select = document.getElementById(id);
    const value = params.get(key) || "";
    select.value = Array.from(select.options).some((o) => o.value === value) ? value : "";
  }
  applyFilters();
  document.getElementById("gallery").scrollIntoView();
  return true;
}

for (const id of Object.values(FILTERS)) {
  document.getElementById(id).addEventListener("change", applyFilters);
}
window.addEventListener("hashchange", filtersFromHash);
if (!filtersFromHash()) applyFilters();
