// Applied in <head> before the page paints: the theme chosen with the header's toggle
// (light or dark, kept in localStorage); without a choice the system's preference applies.
(function () {
  "use strict";
  // Prism (vendor/prism) highlights only what app.js hands it, never on its own.
  window.Prism = window.Prism || { manual: true };
  try {
    const t = localStorage.getItem("asyncq.theme");
    if (t === "light" || t === "dark") document.documentElement.dataset.theme = t;
  } catch (e) { /* storage disabled: follow the system */ }
})();
