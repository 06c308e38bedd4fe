// Loaded between require.js and the ipywidgets embed bundle (nb_ipywidgets_js in _config.yml).
// The bundle's AMD modules locate their own files (the Font Awesome fonts of widget icons) from
// their module URL, which require.js otherwise derives from the page's folder (404s, and pages
// in subfolders look elsewhere again). Map them under _static/, where tools/book_assets.sh puts
// the fonts (jupyter-widgets/html-manager/dist/).
(function () {
  var staticDir = document.currentScript.src.replace(/[^/]*$/, "");
  require.config({ paths: { "@jupyter-widgets": staticDir + "jupyter-widgets" } });
})();

// @jupyter-widgets/controls 2.x typesets a widget's description and an HTML widget's value with
// the MathJax 2 API, `MathJax.Hub.Queue(["Typeset", MathJax.Hub, el])`, whenever
// `window.MathJax` exists. The book loads MathJax 3, which has no `Hub`: every labelled control
// threw "Cannot read properties of undefined (reading 'Queue')" and was left half drawn. Give
// it a `Hub.Queue` that asks MathJax 3 to typeset that element once MathJax has started.
(function () {
  function queue(job) {
    var el = job && job[2];
    var mj = window.MathJax;
    if (!el || !mj) return;
    var ready = mj.startup && mj.startup.promise ? mj.startup.promise : Promise.resolve();
    ready.then(function () {
      if (window.MathJax.typesetPromise) return window.MathJax.typesetPromise([el]);
    }).catch(function (e) { console.warn("MathJax could not typeset a widget label:", e); });
  }
  function shim() {
    if (window.MathJax && !window.MathJax.Hub) window.MathJax.Hub = { Queue: queue };
  }
  shim();                                   // on the configuration object, before MathJax loads
  window.addEventListener("DOMContentLoaded", shim);   // and on MathJax 3 itself, once loaded
  window.addEventListener("load", shim);
})();
