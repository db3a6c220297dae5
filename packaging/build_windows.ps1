# Build Hearth for Windows x64: dist\hearth\ with Hearth.exe (windowed, to double-click) and hearth-cli.exe
# (console: --version, models, --smoke-test), then, when Inno Setup's iscc.exe is found,
# dist\Hearth-<version>-windows-x64-setup.exe.
#
#   powershell -ExecutionPolicy Bypass -File packaging\build_windows.ps1 [-NoInstall] [-NoInstaller]
#   Environment: PYTHON (default: python); HEARTH_SIGN_CERT_SHA1 = thumbprint of a code-signing certificate in
#   the certificate store: signs both executables and the installer with signtool and an RFC 3161 timestamp
#   (see packaging\RELEASING.md). Needs Python 3.11 x64 and the MSVC build tools (for the C kernels).
param([switch]$NoInstall, [switch]$NoInstaller)
$ErrorActionPreference = "Stop"
Set-StrictMode -Version Latest

$Root = Split-Path -Parent $PSScriptRoot
$Python = if ($env:PYTHON) { $env:PYTHON } else { "python" }
$Dist = if ($env:HEARTH_DIST_DIR) { $env:HEARTH_DIST_DIR } else { Join-Path $Root "dist" }
$Work = if ($env:HEARTH_WORK_DIR) { $env:HEARTH_WORK_DIR } else { Join-Path $Root "build\pyinstaller" }
$Timestamp = "http://timestamp.digicert.com"

function Invoke-Checked([string]$Exe, [string[]]$Arguments) {
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$Exe $($Arguments -join ' ') failed with exit code $LASTEXITCODE" }
}

function Sign-File([string]$Path) {
    if (-not $env:HEARTH_SIGN_CERT_SHA1) { return }
    Invoke-Checked "signtool" @("sign", "/sha1", $env:HEARTH_SIGN_CERT_SHA1, "/fd", "SHA256",
                                "/tr", $Timestamp, "/td", "SHA256", "/d", "Hearth", $Path)
    Invoke-Checked "signtool" @("verify", "/pa", "/v", $Path)
}

Push-Location $Root
try {
    if (-not $NoInstall) { Invoke-Checked $Python @("-m", "pip", "install", "-q", "-e", ".[packaging]") }
    Remove-Item Env:HEARTH_CPU_ISA -ErrorAction SilentlyContinue
    Invoke-Checked $Python @("-c", "from engine.backends.cpu import kernels; assert kernels.AVAILABLE, 'the C kernels are not built'")
    $Version = (& $Python -c "import engine; print(engine.__version__)").Trim()

    Invoke-Checked $Python @("-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
                             "--distpath", $Dist, "--workpath", $Work, "packaging\hearth.spec")
    $Bundle = Join-Path $Dist "hearth"
    $Cli = Join-Path $Bundle "hearth-cli.exe"

    # The bundle answers for itself before it is signed or packed: version, then a real chat offscreen.
    $Printed = (& $Cli --version).Trim()
    if ($Printed -ne "hearth $Version") { throw "the bundle says '$Printed', the source says $Version" }
    $Smoke = Join-Path ([System.IO.Path]::GetTempPath()) ("hearth-smoke-" + [guid]::NewGuid())
    $env:QT_QPA_PLATFORM = "offscreen"
    Invoke-Checked $Cli @("--smoke-test", $Smoke)
    Remove-Item Env:QT_QPA_PLATFORM
    Write-Host "smoke test passed: $((Get-ChildItem $Smoke).Name -join ' ')"

    Sign-File (Join-Path $Bundle "Hearth.exe")
    Sign-File $Cli
    $Size = (Get-ChildItem $Bundle -Recurse -File | Measure-Object -Sum Length).Sum / 1MB
    Write-Host ("bundle: {0} ({1:N0} MB)" -f $Bundle, $Size)

    if (-not $NoInstaller) {
        $Iscc = $null
        $Found = Get-Command "iscc" -ErrorAction SilentlyContinue
        if ($Found) { $Iscc = $Found.Source }
        foreach ($Candidate in @((Join-Path ${env:ProgramFiles(x86)} "Inno Setup 6\ISCC.exe"),
                                 (Join-Path $env:LOCALAPPDATA "Programs\Inno Setup 6\ISCC.exe"))) {
            if (-not $Iscc -and (Test-Path $Candidate)) { $Iscc = $Candidate }
        }
        if (-not $Iscc) {
            Write-Warning "Inno Setup (iscc.exe) not found: no installer built. winget install JRSoftware.InnoSetup"
        } else {
            $Icon = Join-Path $Work "hearth\icons\hearth.ico"
            $IsccArgs = @("/Q", "/DAppVersion=$Version", "/DSourceDir=$Bundle", "/DIconFile=$Icon", "/DOutputDir=$Dist")
            if ($env:HEARTH_SIGN_CERT_SHA1) {
                # Inno Setup runs this for the installer and the uninstaller it embeds; it replaces $f by the file.
                $IsccArgs += @("/DSign=1", ("/Shearthsign=signtool sign /sha1 $($env:HEARTH_SIGN_CERT_SHA1) " +
                                            "/fd SHA256 /tr $Timestamp /td SHA256 /d Hearth " + '$f'))
            }
            Invoke-Checked $Iscc ($IsccArgs + @("packaging\windows\hearth.iss"))
            $Setup = Join-Path $Dist "Hearth-$Version-windows-x64-setup.exe"
            if ($env:HEARTH_SIGN_CERT_SHA1) { Invoke-Checked "signtool" @("verify", "/pa", "/v", $Setup) }
            Write-Host "installer: $Setup"
        }
    }
} finally {
    Pop-Location
}
