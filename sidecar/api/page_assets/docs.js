// The sidecar's API reference: GET /openapi.json drawn as text. It ships with the sidecar and runs under the live
// page's Content-Security-Policy: it loads nothing from another host, and every value goes into the page as text.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
function $(id) { return document.getElementById(id); }
function ref(schema) {  // "#/components/schemas/X" -> X; an inline schema as compact JSON
  if (!schema) return "";
  if (schema.$ref) return schema.$ref.split("/").pop();
  return JSON.stringify(schema);
}

function operation(path, method, op) {
  const params = (op.parameters || []).map(p => el("li", {}, `${p.in} ${p.name}${p.required ? " (required)" : ""}: ` +
                                                         `${ref(p.schema)}${p.description ? " — " + p.description : ""}`));
  const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
  const responses = Object.entries(op.responses || {}).map(([code, r]) => {
    const content = r.content && r.content["application/json"];
    return el("li", {}, `${code} ${r.description || ""}` + (content ? ` → ${ref(content.schema)}` : ""));
  });
  return el("section", { class: "operation", "data-operation": `${method.toUpperCase()} ${path}` },
    el("h3", {}, `${method.toUpperCase()} ${path}`, el("span", { class: "muted" }, `  ${op.summary || ""}`)),
    ...(op.description ? [el("p", {}, op.description)] : []),
    ...(params.length ? [el("div", {}, "parameters"), el("ul", {}, ...params)] : []),
    ...(body ? [el("div", {}, `body: ${ref(body.schema)}`)] : []),
    el("div", {}, "responses"), el("ul", {}, ...responses));
}

async function draw() {
  try {
    const r = await fetch("/openapi.json", { cache: "no-store" });
    const doc = await r.json();
    $("docs-title").textContent = `${doc.info.title} ${doc.info.version}`;
    $("operations").replaceChildren(...Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.entries(ops).map(([method, op]) => operation(path, method, op))));
    $("schemas").replaceChildren(...Object.entries((doc.components || {}).schemas || {}).map(([name, schema]) =>
      el("details", { "data-schema": name }, el("summary", {}, name), el("pre", {}, JSON.stringify(schema, null, 2)))));
  } catch (e) {
    $("operations").textContent = `GET /openapi.json failed: ${e}`;
  }
}

document.addEventListener("DOMContentLoaded", draw);
