// ciuic/export.h — symbol visibility for the ciuic SDK.
//
// ciuic is built with -fvisibility=hidden. Everything a plugin or application may use is marked
// CIUIC_API (default visibility), including the interface classes, so that their type_info and
// vtables are shared across the core and every plugin (dynamic_cast and exceptions work across
// library boundaries).
#pragma once

#if defined(_WIN32)
#error "ciuic supports Linux only"
#endif

#define CIUIC_API __attribute__((visibility("default")))
