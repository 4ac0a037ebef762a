// The built-in chat page served at GET /: one static HTML/JS file (chat_page.html, no framework,
// no CDN) compiled into the binary.
#pragma once

#include <string_view>

namespace specula::server {

std::string_view chat_page_html();

}  // namespace specula::server
