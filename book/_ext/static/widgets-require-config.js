// Loaded between require.js and the ipywidgets embed bundle (nb_ipywidgets_js in _config.yml).
// The bundle's AMD modules locate their own files (the Font Awesome fonts of widget icons) from
// their module URL, which require.js otherwise derives from the page's folder (404s, and pages
// in subfolders look elsewhere again). Map them under _static/, where tools/book_assets.sh puts
// the fonts (jupyter-widgets/html-manager/dist/).
(function () {
  var staticDir = document.currentScript.src.replace(/[^/]*$/, "");
  require.config({ paths: { "@jupyter-widgets": staticDir + "jupyter-widgets" } });
})();
