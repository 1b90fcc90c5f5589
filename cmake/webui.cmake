# cmake/webui.cmake — the chat page: web/build.mjs bundles web/src with the npm libraries that
# scripts/bootstrap.sh installs into web/node_modules (no network at build time) and writes
# webui_assets.c (every file as a C array, its gzip form, a content-hash ETag), which is
# compiled into the inferd binary. Without node or those packages the binary gets a one-line
# page saying how to build the real one.
set(INFERD_WEBUI_DIR ${CMAKE_BINARY_DIR}/web)
set(INFERD_WEBUI_C ${INFERD_WEBUI_DIR}/webui_assets.c)
find_program(INFERD_NODE node)
file(GLOB INFERD_WEBUI_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/web/src/*)

if(INFERD_NODE AND EXISTS ${CMAKE_SOURCE_DIR}/web/node_modules/esbuild/package.json)
  add_custom_command(
    OUTPUT ${INFERD_WEBUI_C}
    COMMAND ${INFERD_NODE} ${CMAKE_SOURCE_DIR}/web/build.mjs ${INFERD_WEBUI_DIR}/dist ${INFERD_WEBUI_C}
    DEPENDS ${INFERD_WEBUI_SOURCES} ${CMAKE_SOURCE_DIR}/web/build.mjs
            ${CMAKE_SOURCE_DIR}/web/package-lock.json
    COMMENT "Building the chat page (web/) into webui_assets.c"
    VERBATIM)
else()
  message(WARNING "node or web/node_modules is missing (run scripts/bootstrap.sh, then cmake "
                  "again): the chat page at / will only say how to build it")
  file(MAKE_DIRECTORY ${INFERD_WEBUI_DIR})
  file(WRITE ${INFERD_WEBUI_C} [=[
/* Written by cmake/webui.cmake without web/node_modules: a page saying how to build the real one. */
#include "api/webui.h"

static const unsigned char page[] =
    "<!doctype html><title>inferd</title><p>This inferd was built without its chat page: run "
    "scripts/bootstrap.sh, then build again.</p>";

static const struct webui_asset assets[] = {
    {"/", "text/html; charset=utf-8", page, sizeof page - 1, NULL, 0, "\"unbuilt\""},
};

const struct webui_assets webui_bundle = {assets, 1};
]=])
endif()
target_sources(inferd PRIVATE ${INFERD_WEBUI_C})
