#!/usr/bin/env bash
# Fetch the JavaScript the static book needs, so the built pages load nothing from a CDN.
#
#   tools/book_assets.sh [PYTHON]      (PYTHON defaults to .venv/bin/python)
#
# Writes book/_vendor/static/ (git-ignored, never committed), which _config.yml serves as
# Sphinx static files (copied to _build/html/_static/):
#   plotly.min.js      from the installed plotly wheel (plotly/package_data/), so the figures
#                      pipelib.viz.display.show() emits match the plotly the kernel ran
#   require.js         requirejs, the AMD loader the ipywidgets embed bundle needs
#   embed-amd.js       @jupyter-widgets/html-manager: renders saved widget state (ipywidgets 8)
#   jupyter-widgets/   the fonts that bundle's CSS loads (widget icons)
#   mathjax/           MathJax 3 (es5 build; pages load mathjax/tex-chtml.js, fonts are local)
# npm packages are fetched as tarballs (`npm pack`, integrity-checked by npm) without their
# dependencies: only the prebuilt bundles are used. Re-running is a no-op when the versions and
# the plotly wheel are unchanged.
set -euo pipefail

REQUIREJS=2.3.7
HTML_MANAGER=1.0.15     # 1.x renders ipywidgets 8 state (@jupyter-widgets/controls 2.x)
MATHJAX=3.2.2           # Sphinx 7 configures MathJax 3

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${1:-$root/.venv/bin/python}"
vendor="$root/book/_vendor"
static="$vendor/static"

plotly_js="$("$python" -c 'import pathlib, plotly; print(pathlib.Path(plotly.__file__).parent / "package_data" / "plotly.min.js")')"
plotly_version="$("$python" -c 'import plotly; print(plotly.__version__)')"
script_hash="$(sha1sum "$0" | cut -c1-12)"   # a change to this script re-fetches
stamp="requirejs=$REQUIREJS html-manager=$HTML_MANAGER mathjax=$MATHJAX plotly=$plotly_version script=$script_hash"

if [[ -f "$vendor/.stamp" && "$(cat "$vendor/.stamp")" == "$stamp" ]]; then
    echo "book assets up to date ($stamp)"
    exit 0
fi

command -v npm >/dev/null || {
    echo "tools/book_assets.sh: npm is needed once to fetch the book's JavaScript" \
         "(Debian: apt-get install npm; or install Node.js)" >&2
    exit 1
}
rm -rf "$vendor/pack" "$static" "$vendor/.stamp"
mkdir -p "$vendor/pack" "$static"
cd "$vendor/pack"
for spec in "requirejs@$REQUIREJS" "@jupyter-widgets/html-manager@$HTML_MANAGER" "mathjax@$MATHJAX"; do
    tarball="$(npm pack --silent "$spec" | tail -n 1)"
    name="${spec%@*}"; name="${name//\//-}"; name="${name#@}"
    mkdir -p "$name"
    tar -xzf "$tarball" -C "$name" --strip-components=1
done

cp "$plotly_js" "$static/plotly.min.js"
cp requirejs/require.js "$static/require.js"
cp jupyter-widgets-html-manager/dist/embed-amd.js "$static/embed-amd.js"
# fonts the bundle's CSS asks for next to its module URL (see book/_ext/static/widgets-require-config.js):
# @jupyter-widgets/html-manager looks in jupyter-widgets/html-manager/dist/, and
# @jupyter-widgets/controls (a Button's icon) in jupyter-widgets/
mkdir -p "$static/jupyter-widgets/html-manager/dist"
cp jupyter-widgets-html-manager/dist/*.{woff2,woff,ttf,eot,svg} "$static/jupyter-widgets/html-manager/dist/"
cp jupyter-widgets-html-manager/dist/*.{woff2,woff,ttf,eot,svg} "$static/jupyter-widgets/"
cp -r mathjax/es5 "$static/mathjax"
cd "$root" && rm -rf "$vendor/pack"

for f in plotly.min.js require.js embed-amd.js mathjax/tex-chtml.js; do
    [[ -s "$static/$f" ]] || { echo "book assets: $static/$f is missing or empty" >&2; exit 1; }
done
echo "$stamp" > "$vendor/.stamp"
echo "book assets installed in $static ($stamp, $(du -sh "$static" | cut -f1))"
