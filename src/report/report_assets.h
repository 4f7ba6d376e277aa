// What report.html inlines, compiled in so a report can be written on any node: the page
// (src/report/report_page.html) and Chart.js from Debian's libjs-chart.js.
#pragma once

namespace tandem {
const char* report_page_template();  // with the markers report_html.cpp replaces
const char* chart_js();
}  // namespace tandem
